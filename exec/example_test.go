package exec_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/podvm/podvm/exec"
)

func Example() {
	x := exec.NewCommandExecutor()
	res, err := x.Run(context.Background(), exec.Command{
		Name: "sh",
		Args: []string{"-c", "echo out; echo err >&2; exit 3"},
	})
	if err != nil {
		panic(err)
	}
	fmt.Printf("exit %d, stdout %q, stderr %q\n", res.ExitCode, res.Stdout, res.Stderr)
	// Output: exit 3, stdout "out\n", stderr "err\n"
}

func Example_noShell() {
	// Arguments are never interpreted: no shell ever sees them.
	res, _ := exec.NewCommandExecutor().Run(context.Background(), exec.Command{
		Name: "echo",
		Args: []string{"$(reboot)", "; rm -rf /", "*"},
	})
	fmt.Print(res.Stdout)
	// Output: $(reboot) ; rm -rf / *
}

func Example_timeout() {
	res, err := exec.NewCommandExecutor().Run(context.Background(), exec.Command{
		Name:    "sh",
		Args:    []string{"-c", "echo started; sleep 60 & sleep 60"},
		Timeout: 100 * time.Millisecond,
	})
	fmt.Println(errors.Is(err, context.DeadlineExceeded), res.TimedOut, res.ExitCode)
	fmt.Print(res.Stdout)
	// Output:
	// true true -1
	// started
}

func Example_outputCap() {
	res, _ := exec.NewCommandExecutor().Run(context.Background(), exec.Command{
		Name:           "seq",
		Args:           []string{"100000"},
		MaxOutputBytes: 64,
	})
	fmt.Println(res.Truncated, res.StdoutBytes)
	fmt.Print(res.StdoutTail(2))
	// Output:
	// true 588895
	// 99999
	// 100000
}

func ExampleRestrict() {
	x := exec.Restrict(exec.NewCommandExecutor(), exec.Policy{
		Grants: []string{"exec:echo", "exec:go"},
		Dirs:   []string{"/tmp"},
	})
	_, err := x.Run(context.Background(), exec.Command{Name: "rm", Args: []string{"-rf", "/tmp/x"}})
	fmt.Println(errors.Is(err, exec.ErrNotAllowed), err)
	// Output: true exec: not allowed by policy: command "rm"
}

func ExampleResult_MarshalJSON() {
	data, _ := json.Marshal(exec.Result{Stdout: "hi\n", ExitCode: 0, Duration: 1500 * time.Microsecond, StdoutBytes: 3})
	fmt.Println(string(data))
	// Output: {"stdout":"hi\n","stderr":"","exit_code":0,"duration_ms":1.5,"is_timeout":false,"truncated":false,"stdout_bytes":3,"stderr_bytes":0}
}
