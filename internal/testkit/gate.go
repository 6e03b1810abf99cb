package testkit

import (
	"os"
	"testing"
)

// Required reports whether a test whose service is missing must fail
// rather than skip: under CI=true, or when the variable env (if not
// empty) is "1". CI sets them so that it can never pass by skipping.
func Required(env string) bool {
	return os.Getenv("CI") == "true" || env != "" && os.Getenv(env) == "1"
}

// SkipOrFail skips t saying why, or fails it when [Required](env),
// saying also which variable made it fail. why should name the variables
// that would enable the test.
func SkipOrFail(t testing.TB, env, why string) {
	t.Helper()
	if Required(env) {
		if env == "" {
			t.Fatal(why + "; failing because CI=true")
		}
		t.Fatal(why + "; failing because CI=true or " + env + "=1")
	}
	t.Skip(why)
}
