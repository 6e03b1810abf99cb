package vm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// This file is who made a sandbox or a snapshot, as [LabelOwner] names
// it, and how [Reap] judges whether that process is gone.
//
// A PID alone names a process only within one PID namespace, during one
// boot, until the PID is reused. So the label is SPACE.PID.START: SPACE
// is the boot and the PID namespace (a hash of both), START the process's
// start time, which a process that reuses the PID does not share. The
// time namespace goes into SPACE too: /proc shows a start time shifted by
// the reader's.

// owner is a process as [LabelOwner] names it.
type owner struct {
	space string // the first 16 hex digits of the sha256 of the boot ID and the PID and time namespaces
	pid   int
	start uint64 // clock ticks from boot to the process's start
}

func (o owner) String() string {
	return o.space + "." + strconv.Itoa(o.pid) + "." + strconv.FormatUint(o.start, 10)
}

var spaceRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

// parseOwner reads a [LabelOwner] value; ok is false when it is malformed.
func parseOwner(s string) (o owner, ok bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 || !spaceRE.MatchString(parts[0]) {
		return owner{}, false
	}
	pid, err1 := strconv.ParseUint(parts[1], 10, 31)
	start, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || pid == 0 {
		return owner{}, false
	}
	return owner{space: parts[0], pid: int(pid), start: start}, true
}

// self is this process's [LabelOwner] value, or "" where /proc cannot
// name it: not Linux, /proc unreadable, or /proc of another PID
// namespace (whose PIDs are not ours).
var self = sync.OnceValue(func() string {
	pid := os.Getpid()
	if s, err := os.Readlink("/proc/self"); err != nil || s != strconv.Itoa(pid) {
		return ""
	}
	boot, err1 := os.ReadFile("/proc/sys/kernel/random/boot_id")
	ns, err2 := os.Readlink("/proc/self/ns/pid")
	timeNS, _ := os.Readlink("/proc/self/ns/time") // none before Linux 5.6
	start, err3 := startTime(pid)
	boot = bytes.TrimSpace(boot)
	if errors.Join(err1, err2, err3) != nil || len(boot) == 0 || ns == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(string(boot) + "\n" + ns + "\n" + timeNS))
	return owner{space: hex.EncodeToString(sum[:8]), pid: pid, start: start}.String()
})

// setOwner sets the labels that name this process as the maker of a
// sandbox or snapshot: [LabelOwner], [LabelOwnerPID], [LabelOwnerHost].
// LabelOwner is set empty where [self] is "": absent, the container would
// take the image's, which a snapshot has from whoever took it.
func setOwner(l map[string]string) {
	l[LabelOwner] = self()
	host, _ := os.Hostname()
	l[LabelOwnerPID] = strconv.Itoa(os.Getpid())
	l[LabelOwnerHost] = host
}

// ownSpace is the SPACE of [self], or "".
func ownSpace() string {
	space, _, _ := strings.Cut(self(), ".")
	return space
}

// startTime returns when process pid started, in clock ticks since boot
// (field 22 of /proc/PID/stat). For a process that does not exist, the
// error matches fs.ErrNotExist.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, syscall.ESRCH) { // it ended between the open and the read
		err = fmt.Errorf("%w: %w", fs.ErrNotExist, err)
	}
	if err != nil {
		return 0, err
	}
	return parseStartTime(b)
}

// parseStartTime reads field 22 of a /proc/PID/stat line. Field 2, the
// command's name in parentheses, may hold anything, blanks and ')' too:
// the fields are counted from the last ')'.
func parseStartTime(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("vm: /proc stat %q: no command name", stat)
	}
	f := strings.Fields(string(stat[i+1:])) // from field 3
	if len(f) < 20 {
		return 0, fmt.Errorf("vm: /proc stat %q: no start time", stat)
	}
	return strconv.ParseUint(f[22-3], 10, 64)
}

// ownerCheck judges, for [Reap], whether the process that made a sandbox
// or a snapshot is gone. Reap makes one per call.
type ownerCheck struct {
	space string                        // ours ([ownSpace]); "" judges no LabelOwner
	host  string                        // our hostname, for the legacy labels
	start func(pid int) (uint64, error) // [startTime]
	alive func(pid int) bool            // [processAlive]
}

// newOwnerCheck is the check of this process.
func newOwnerCheck() ownerCheck {
	host, _ := os.Hostname()
	return ownerCheck{space: ownSpace(), host: host, start: startTime, alive: processAlive}
}

// gone says why the owner the labels name is gone, or "" when it is alive
// or not ours to judge. A well-formed [LabelOwner] decides alone: of
// another SPACE (machine, boot, PID or time namespace), it is not ours to
// judge; of ours, the owner is gone when its PID names no process, or a
// process with another start time (the PID was reused). When /proc
// cannot be read for another reason (hidepid's EACCES), or hides a
// process that signal 0 still finds (hidepid=invisible), the owner is
// taken to be alive. Without a well-formed LabelOwner, the legacy labels
// judge: the owner is gone when [LabelOwnerHost] is our hostname and no
// process has its [LabelOwnerPID].
func (c ownerCheck) gone(labels map[string]string) string {
	if o, ok := parseOwner(labels[LabelOwner]); ok {
		if c.space == "" || o.space != c.space {
			return ""
		}
		start, err := c.start(o.pid)
		switch {
		case errors.Is(err, fs.ErrNotExist) && !c.alive(o.pid):
			return fmt.Sprintf("owner process %d is gone", o.pid)
		case err != nil:
			return ""
		case start != o.start:
			return fmt.Sprintf("owner process %d is gone (its PID now names another process)", o.pid)
		}
		return ""
	}
	pid, err := strconv.Atoi(labels[LabelOwnerPID])
	if err == nil && pid > 0 && labels[LabelOwnerHost] == c.host && !c.alive(pid) {
		return fmt.Sprintf("owner process %d is gone", pid)
	}
	return ""
}
