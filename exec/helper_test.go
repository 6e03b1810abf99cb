package exec_test

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/podvm/podvm/exec"
)

// The test binary doubles as the fake commands, as in os/exec's own tests:
// with PODVM_TEST_HELPER set, TestMain runs helperMain instead of tests.
func TestMain(m *testing.M) {
	if os.Getenv("PODVM_TEST_HELPER") == "1" {
		os.Exit(helperMain(os.Args[1:]))
	}
	m.Run()
}

// helper returns a Command running the fake command name with args.
func helper(name string, args ...string) exec.Command {
	return exec.Command{
		Name: os.Args[0],
		Args: append([]string{name}, args...),
		Env:  []string{"PODVM_TEST_HELPER=1"},
	}
}

func helperMain(args []string) int {
	name, args := args[0], args[1:]
	switch name {
	case "args": // each argument, NUL-terminated
		for _, a := range args {
			fmt.Printf("%s\x00", a)
		}
	case "out": // out STDOUT STDERR CODE
		fmt.Print(args[0])
		fmt.Fprint(os.Stderr, args[1])
		code, _ := strconv.Atoi(args[2])
		return code
	case "env":
		fmt.Print(strings.Join(os.Environ(), "\n"))
	case "pwd":
		wd, _ := os.Getwd()
		fmt.Print(wd)
	case "cat":
		if _, err := io.Copy(os.Stdout, os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "lines": // lines N: "line 1\n" ... "line N\n"
		n, _ := strconv.Atoi(args[0])
		var b strings.Builder
		for i := 1; i <= n; i++ {
			fmt.Fprintf(&b, "line %d\n", i)
		}
		os.Stdout.WriteString(b.String())
	case "bytes": // bytes N: N bytes of 'x' in 64 KiB writes, on stdout and stderr when "both"
		n, _ := strconv.Atoi(args[0])
		chunk := []byte(strings.Repeat("x", 64<<10))
		for n > 0 {
			k := min(n, len(chunk))
			os.Stdout.Write(chunk[:k])
			if len(args) > 1 {
				os.Stderr.Write(chunk[:k])
			}
			n -= k
		}
	case "signal": // signal N: kill itself with signal N
		n, _ := strconv.Atoi(args[0])
		syscall.Kill(os.Getpid(), syscall.Signal(n))
		select {}
	default:
		fmt.Fprintf(os.Stderr, "unknown helper %q\n", name)
		return 2
	}
	return 0
}
