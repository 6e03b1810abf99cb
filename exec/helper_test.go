package exec_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
)

var sink int

// The test binary doubles as the fake commands, as in os/exec's own tests:
// with PODVM_TEST_HELPER set, TestMain runs helperMain instead of tests.
// It calls exec.Init first, as a program must for the subreaper
// containment: re-executed as the helper, it goes no further.
func TestMain(m *testing.M) {
	exec.Init()
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
	case "escape": // escape HOW MARK exit|hang: start "linger HOW MARK" escaping as HOW, print its pid
		how, mark := args[0], args[1]
		attr := &syscall.SysProcAttr{}
		env := []string{"PODVM_TEST_HELPER=1", "PODVM_MARK=" + mark}
		switch how {
		case "setsid":
			attr.Setsid = true
		case "setpgid", "rename":
			attr.Setpgid = true
		case "clearenv":
			env = []string{"PODVM_TEST_HELPER=1"}
		}
		p, err := os.StartProcess(os.Args[0], []string{os.Args[0], "linger", how, mark}, &os.ProcAttr{
			Env: env, Files: []*os.File{nil, os.Stdout, os.Stderr}, Sys: attr})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(p.Pid)
		if args[2] == "hang" {
			time.Sleep(time.Hour)
		}
	case "linger": // linger HOW MARK: stay alive for an hour, first forking again for "doublefork"
		switch args[0] {
		case "doublefork":
			p, err := os.StartProcess(os.Args[0], []string{os.Args[0], "linger", "setsid", args[1]}, &os.ProcAttr{
				Env: os.Environ(), Files: []*os.File{nil, os.Stdout, os.Stderr}, Sys: &syscall.SysProcAttr{Setsid: true}})
			if err == nil {
				fmt.Println(p.Pid)
			}
			return 0 // the grandchild is orphaned
		case "rename":
			rename("kworker/0:1")
		}
		time.Sleep(time.Hour) // holding the run's stdout and stderr

	case "crash": // crash CONTAINMENT MARK [PARENT]: print its pid, start "sleep MARK" twice, one detached, under CONTAINMENT (run cgroups under PARENT), then die mid-run
		c := map[string]exec.Containment{"cgroup": exec.ContainCgroup, "subreaper": exec.ContainSubreaper}[args[0]]
		opts := []exec.Option{exec.WithContainment(c)}
		if len(args) > 2 {
			opts = append(opts, exec.WithCgroupParent(args[2]))
		}
		x := exec.NewCommandExecutor(opts...)
		fmt.Print(os.Getpid())
		started := make(chan struct{})
		go x.Run(context.Background(), exec.Command{Name: "sh", Args: []string{"-c", "setsid sleep $0 & echo started; exec sleep $0", args[1]},
			Stdout: firstWrite{started}})
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			fmt.Fprintln(os.Stderr, "the run did not start")
			return 1
		}
		time.Sleep(50 * time.Millisecond) // for setsid's sleep to be there too
		os.Exit(3)
	case "runs": // runs N: N runs of /bin/true back to back in a run cgroup each, then exit at once
		x := exec.NewCommandExecutor(exec.WithContainment(exec.ContainCgroup))
		n, _ := strconv.Atoi(args[0])
		for range n {
			if _, err := x.Run(context.Background(), exec.Command{Name: "/bin/true"}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		dirs, err := ownCgroupDirs()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if left, err := runCgroupsIn(dirs, strconv.Itoa(os.Getpid())); err != nil || len(left) > 0 {
			fmt.Fprintln(os.Stderr, "cgroups left:", left, err)
			return 1
		}
		fmt.Print(os.Getpid())
	case "burn": // burn D [FILE]: spin until this process has used D of CPU time; with FILE, then create it and spin on
		d, _ := time.ParseDuration(args[0])
		for {
			var ru syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
			if time.Duration(ru.Utime.Nano()+ru.Stime.Nano()) >= d {
				if len(args) < 2 {
					return 0
				}
				os.WriteFile(args[1], nil, 0o644)
				d = 1 << 62
			}
			for i := 0; i < 1e6; i++ {
				sink += i
			}
		}
	case "touch": // touch N: allocate N MiB and write every page
		n, _ := strconv.Atoi(args[0])
		mem := make([]byte, n<<20)
		for i := 0; i < len(mem); i += 4096 {
			mem[i] = 1
		}
		fmt.Println(len(mem))
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

// firstWrite closes its channel on its first Write.
type firstWrite struct{ c chan struct{} }

func (w firstWrite) Write(p []byte) (int, error) {
	select {
	case <-w.c:
	default:
		close(w.c)
	}
	return len(p), nil
}

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
