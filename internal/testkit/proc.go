package testkit

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// pfExiting is the kernel's PF_EXITING task flag: set when a process
// starts to exit, before it leaves its cgroup.
const pfExiting = 0x4

// Alive reports whether process pid can still run code: it exists, is
// neither a zombie nor being reaped, and has not begun to exit. A killed
// process leaves its cgroup (which then reads empty) while it is still
// exiting, before it is a zombie; a check made the moment a kill is
// known to be done must count it dead, or it fails on a loaded machine.
// Off Linux, or where /proc cannot be read, it reports false.
func Alive(pid int) bool {
	state, flags, ok := procStat(pid)
	return ok && running(state, flags)
}

// running reports whether a process in state with flags can run code.
func running(state string, flags uint64) bool {
	return state != "Z" && state != "X" && flags&pfExiting == 0
}

// Describe says what /proc knows of process pid: its state, flags and
// cgroup, for a test's failure message.
func Describe(pid int) string {
	state, flags, ok := procStat(pid)
	if !ok {
		return fmt.Sprintf("%d: gone", pid)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	cgroup, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return fmt.Sprintf("%d: state %s flags %#x argv %q cgroup %q", pid, state, flags,
		strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " "), strings.TrimSpace(string(cgroup)))
}

// procStat reads the state and flags fields of /proc/pid/stat.
func procStat(pid int) (state string, flags uint64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, false
	}
	return parseStat(string(b))
}

// parseStat parses the state and flags fields of a /proc/pid/stat line.
func parseStat(s string) (state string, flags uint64, ok bool) {
	// The name, in parentheses, may hold spaces and parentheses itself.
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 7 {
		return "", 0, false
	}
	flags, err := strconv.ParseUint(fields[6], 10, 64)
	return fields[0], flags, err == nil
}
