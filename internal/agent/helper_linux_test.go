package agent

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// helper is the test binary run as a command inside the sandbox.
func helper(name string, args []string) int {
	switch name {
	case "burn": // burn 1 s of user CPU
		for {
			var ru unix.Rusage
			_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
			if time.Duration(ru.Utime.Nano()) >= time.Second {
				return 0
			}
			for i := 0; i < 1e6; i++ {
				sink += i
			}
		}
	case "touch": // touch 64 MiB
		b := make([]byte, 64<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		sink += int(b[len(b)-4096])
		return 0
	case "attack": // what a root process in the sandbox tries against PID 1 and its own shim
		for _, pid := range []int{1, os.Getppid()} {
			p := strconv.Itoa(pid)
			try(p+" readlink fds", func() error {
				// Listing the fd numbers is allowed to the owner (root);
				// where they lead and what they hold is not.
				ents, err := os.ReadDir("/proc/" + p + "/fd")
				if err != nil {
					return err
				}
				for _, e := range ents {
					if _, err = os.Readlink("/proc/" + p + "/fd/" + e.Name()); err == nil {
						return nil
					}
				}
				return err
			})
			try(p+" read environ", func() error { _, err := os.ReadFile("/proc/" + p + "/environ"); return err })
			try(p+" read mem", func() error { _, err := os.ReadFile("/proc/" + p + "/mem"); return err })
			try(p+" open fd 100", func() error {
				f, err := os.OpenFile("/proc/"+p+"/fd/100", os.O_RDWR, 0)
				if err == nil {
					f.Close()
				}
				return err
			})
			try(p+" ptrace", func() error {
				err := unix.PtraceAttach(pid)
				if err == nil {
					_ = unix.PtraceDetach(pid)
				}
				return err
			})
			try(p+" pidfd_getfd", func() error {
				fd, err := unix.PidfdOpen(pid, 0)
				if err != nil {
					return err
				}
				defer unix.Close(fd)
				for target := 0; target < 200; target++ {
					if got, err := unix.PidfdGetfd(fd, target, 0); err == nil {
						unix.Close(got)
						return nil
					} else if err != unix.EBADF {
						return err
					}
				}
				return unix.EBADF
			})
		}
		for s := syscall.Signal(1); s <= 31; s++ {
			if s != unix.SIGSTOP && s != unix.SIGCHLD && s != unix.SIGCONT {
				_ = unix.Kill(1, s)
			}
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown helper", name)
	return 2
}

var sink int

// try prints what an attack achieved: "ok" lines are failures of the
// agent's defences.
func try(what string, f func() error) {
	if err := f(); err != nil {
		fmt.Printf("denied %s: %v\n", what, err)
	} else {
		fmt.Printf("ok %s\n", what)
	}
}
