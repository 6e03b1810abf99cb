package vmtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// defaultCapEff is the effective capability mask of root in a sandbox with
// vm.DefaultCapabilities: CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4,
// KILL 5, SETGID 6, SETUID 7.
const defaultCapEff = "00000000000000fb"

// outcome is an observation of facts a case derived, for output that
// differs from run to run (error messages of a fork bomb, say).
func outcome(label string, facts ...any) observation {
	return observation{Label: label, Result: &exec.Result{Stdout: fmt.Sprint(facts...)}}
}

// hardeningCases check the sandbox's defenses: what untrusted code finds
// inside, and that it cannot harm the host or outlive its timeout.
func hardeningCases(h Harness) []testCase {
	return []testCase{
		{Name: "hardening/defaults", Promise: "by default: no-new-privileges, only vm.DefaultCapabilities, the pids limit, loopback only",
			// Pids named: a harness may run the cases that ask for no
			// limit with vm.NoPidsLimit, where a limit is refused.
			Config: func(c *vm.Config) { c.Pids = vm.DefaultPids },
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				res, err, o := run(ctx, v, "defaults", sh(`id -u
grep -E '^(NoNewPrivs|CapEff):' /proc/self/status | tr -s '\t ' ' '
cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max
sed -n 's/^ *\([^:]*\):.*/\1/p' /proc/net/dev`))
				want(t, res, err, fmt.Sprintf("0\nCapEff: %s\nNoNewPrivs: 1\n%d\nlo\n", defaultCapEff, vm.DefaultPids), "", 0)
				return []observation{o}
			}},
		{Name: "hardening/fork-bomb", Promise: "a fork bomb is held by the pids limit, stopped by its timeout, and the sandbox stays usable",
			Config:   func(c *vm.Config) { c.Pids = 64 },
			Deadline: 2 * time.Minute,
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				// The classic `:(){ :|:& };:` is a syntax error in busybox
				// ash (":" is a special builtin); this is the same bomb,
				// started from a subshell: ash forks both sides of `f|f&`
				// itself, and a shell whose fork fails exits, so the top
				// shell must not race the bomb for the last slot. It spins
				// on builtins, which need no fork, until its timeout. On
				// the Podman exec path the kill is an exec session of its
				// own, which the churn at the limit can starve past
				// vm.KillGrace on a loaded machine: Run must then say so.
				return bomb(ctx, t, v, `(f(){ f|f& }; f) & while :; do :; done`, !h.Tracked())
			}},
		{Name: "hardening/memory", Promise: "a command over the memory limit is killed and reported as exit 137",
			Config: func(c *vm.Config) { c.Memory = 32 << 20 },
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				// tail keeps the current line, and /dev/zero has no newline.
				cmd := exec.Command{Name: "tail", Args: []string{"/dev/zero"}, Timeout: 30 * time.Second}
				res, err, o := run(ctx, v, "hog", cmd)
				if err != nil || res.ExitCode != 137 || res.TimedOut {
					t.Errorf("got %+v, %v; want exit 137", res, err)
				}
				return []observation{o}
			}},
		{Name: "hardening/no-network", Promise: "with the default network, nothing on the host is reachable, not even its loopback",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				ln, err := net.Listen("tcp", ":0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				var accepted atomic.Int32
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						accepted.Add(1)
						c.Close()
					}
				}()
				port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
				var reached []string
				for _, ip := range hostIPv4s(t) {
					res, err := v.Run(ctx, exec.Command{Name: "nc", Args: []string{"-w", "2", ip, port}, Timeout: 10 * time.Second})
					if err != nil {
						t.Fatalf("nc %s: %v", ip, err)
					}
					if res.ExitCode == 0 {
						reached = append(reached, ip)
					}
				}
				if len(reached) > 0 || accepted.Load() > 0 {
					t.Errorf("the sandbox reached the host's listener at %v (%d connections)", reached, accepted.Load())
				}
				return []observation{outcome("network", "reached ", len(reached))}
			}},
		{Name: "hardening/read-only-rootfs", Promise: "ReadOnlyRootfs refuses writes to the image but keeps /tmp writable",
			Config: func(c *vm.Config) { c.ReadOnlyRootfs = true },
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				res, err, o := run(ctx, v, "writes", sh(`touch /etc/podvm 2>/dev/null && echo rootfs-written; touch /tmp/podvm && echo tmp-written`))
				want(t, res, err, "tmp-written\n", "", 0)
				return []observation{o}
			}},
		{Name: "hardening/large-input", Promise: "hundreds of KiB of arguments and environment work; an argument the kernel cannot take is refused up front",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				chunk := strings.Repeat("x", 100<<10)
				cmd := sh(`echo ${#1} ${#2} ${#3} ${#4} ${#5} ${#BIG1} ${#BIG2} ${#BIG3}`, chunk, chunk, chunk, chunk, chunk)
				cmd.Env = []string{"BIG1=" + chunk, "BIG2=" + chunk, "BIG3=" + chunk}
				res, err, o1 := run(ctx, v, "500KiB args, 300KiB env", cmd)
				want(t, res, err, strings.TrimSpace(strings.Repeat("102400 ", 8))+"\n", "", 0)

				// Linux refuses any single argument over 128 KiB (MAX_ARG_STRLEN).
				res, err, o2 := run(ctx, v, "200KiB argument", exec.Command{Name: "echo", Args: []string{strings.Repeat("y", 200<<10)}})
				if !errors.Is(err, exec.ErrInvalidCommand) || res != nil {
					t.Errorf("a 200 KiB argument: got %+v, %v; want exec.ErrInvalidCommand", res, err)
				}
				return []observation{o1, o2}
			}},
		{Name: "hardening/restrict", Promise: "exec.Restrict works on a VM: a denied command never runs",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				r := exec.Restrict(v, exec.Policy{Grants: []string{"exec:echo"}})
				res, err, o1 := run(ctx, r, "allowed", exec.Command{Name: "echo", Args: []string{"ok"}})
				want(t, res, err, "ok\n", "", 0)
				res, err, o2 := run(ctx, r, "denied", sh(`touch /tmp/ran`))
				if !errors.Is(err, exec.ErrNotAllowed) || res != nil {
					t.Errorf("denied command: got %+v, %v; want exec.ErrNotAllowed", res, err)
				}
				check, err := v.Run(ctx, exec.Command{Name: "ls", Args: []string{"/tmp/ran"}})
				if err != nil || check.ExitCode == 0 {
					t.Errorf("the denied command ran: %+v, %v", check, err)
				}
				return []observation{o1, o2}
			}},
	}
}

// hostIPv4s lists this host's IPv4 addresses, loopback first.
func hostIPv4s(t *testing.T) []string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	ips := []string{"127.0.0.1"}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			ips = append(ips, n.IP.String())
		}
	}
	return ips
}
