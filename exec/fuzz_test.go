package exec_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/podvm/podvm/exec"
)

// FuzzCommandJSON: decoding never panics, and whatever Validate accepts is
// free of the bytes that could change the argv's meaning.
func FuzzCommandJSON(f *testing.F) {
	f.Add(`{"command":"go","args":["build"],"env":["A=1"],"timeout":1.5}`)
	f.Add(`{"command":"a\u0000b"}`)
	f.Add(`{"command":"x","env":["NOEQ"],"max_output_bytes":-1}`)
	f.Add(`{"command":"x","max_memory_bytes":-1,"max_pids":3,"max_cpu_time":0.5}`)
	f.Fuzz(func(t *testing.T, in string) {
		var c exec.Command
		if json.Unmarshal([]byte(in), &c) != nil {
			return
		}
		err := c.Validate()
		if err != nil {
			if !errors.Is(err, exec.ErrInvalidCommand) {
				t.Fatalf("Validate error %v is not ErrInvalidCommand", err)
			}
			return
		}
		all := c.Name + c.Dir + strings.Join(c.Args, "") + strings.Join(c.Env, "")
		if c.Name == "" || strings.IndexByte(all, 0) >= 0 || c.Timeout < 0 || c.MaxOutputBytes < 0 ||
			c.MaxMemoryBytes < 0 || c.MaxPids < 0 || c.MaxCPUTime < 0 {
			t.Fatalf("Validate accepted %#v", c)
		}
		for _, e := range c.Env {
			if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
				t.Fatalf("Validate accepted env %q", e)
			}
		}
		// What was accepted survives a round trip.
		data, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var back exec.Command
		if err := json.Unmarshal(data, &back); err != nil || back.Validate() != nil {
			t.Fatalf("round trip of %s: %v", data, err)
		}
	})
}

// FuzzResultJSON: decoding arbitrary input never panics and tails never
// fail on what it produced.
func FuzzResultJSON(f *testing.F) {
	f.Add(`{"stdout":"a\nb","stdout_bytes":99,"truncated":true}`)
	f.Add(`{"stdout":"x\n[... podvm: 5 bytes omitted ...]\ny\n","stdout_bytes":7,"duration_ms":1e300}`)
	f.Fuzz(func(t *testing.T, in string) {
		var r exec.Result
		if json.Unmarshal([]byte(in), &r) != nil {
			return
		}
		for n := 0; n < 3; n++ {
			if tail := r.StdoutTail(n); !strings.HasSuffix(r.Stdout, tail) {
				t.Fatalf("StdoutTail(%d) = %q is not a suffix of %q", n, tail, r.Stdout)
			}
		}
		_ = r.StderrTail(2)
	})
}
