package server

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// children returns the children of process pid (0: this process), read
// from /proc/PID/task/*/children.
func children(pid int) []int {
	dir := "/proc/self/task"
	if pid != 0 {
		dir = "/proc/" + strconv.Itoa(pid) + "/task"
	}
	tasks, _ := filepath.Glob(dir + "/*/children")
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// killTree sends SIGKILL to every descendant of this process whose
// ancestry does not pass through a pid in spare, walking the whole tree
// so that a process that forks while the walk goes on cannot outrun it
// for long: a process with SIGKILL pending forks no more, and what it
// forked before dying is reparented to this process (a subreaper or PID 1)
// and found by the next call. It returns how many processes it signalled
// and the first error other than "no such process".
func killTree(spare map[int]bool) (int, error) {
	var firstErr error
	n := 0
	seen := map[int]bool{}
	queue := children(0)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		if seen[pid] || spare[pid] {
			continue
		}
		seen[pid] = true
		// Kill first so it forks no more, then list what it forked.
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) && firstErr == nil {
			firstErr = err
		}
		n++
		queue = append(queue, children(pid)...)
	}
	return n, firstErr
}
