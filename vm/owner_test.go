package vm

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/podvm/podvm/internal/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitEnv makes the test binary a process that waits for its stdin to
// close (see init), for tests that need a process of their making.
const waitEnv = "PODVM_TEST_WAIT_STDIN"

func init() {
	if os.Getenv(waitEnv) == "1" {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
}

// startWaiter starts the test binary under the name name (a symlink's)
// as a process that waits, and returns its PID and what ends it (and
// waits for it), which the test's cleanup calls too.
func startWaiter(t *testing.T, name string) (pid int, end func() error) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	link := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.Symlink(exe, link))
	cmd := osexec.Command(link)
	cmd.Env = append(os.Environ(), waitEnv+"=1")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	end = func() error {
		stdin.Close()
		return cmd.Wait()
	}
	t.Cleanup(func() { _ = end() })
	return cmd.Process.Pid, end
}

func needProc(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/PID/stat is Linux's")
	}
}

// The start time is field 22 wherever the command's name puts its
// blanks and parentheses.
func TestParseStartTime(t *testing.T) {
	tail := " S 1 2 3 0 -1 4194304 141 0 0 0 0 0 0 0 20 0 1 0 75098 2990080 420\n"
	for _, comm := range []string{"sleep", "a b", "a) (b", ") 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 (", "((", ""} {
		got, err := parseStartTime([]byte("10486 (" + comm + ")" + tail))
		if assert.NoError(t, err, comm) {
			assert.Equal(t, uint64(75098), got, "comm %q", comm)
		}
	}
	for _, bad := range []string{"", "10486 sleep S 1", "10486 (sleep) S 1 2 3", "10486 (x) S 1 2 3 0 -1 4194304 141 0 0 0 0 0 0 0 20 0 1 0 -5 1"} {
		_, err := parseStartTime([]byte(bad))
		assert.Error(t, err, "%q", bad)
	}
}

// A process whose name holds ") (" has the start time that its stat
// shows, counted from the end of the name as /proc/PID/comm gives it.
func TestStartTimeOddName(t *testing.T) {
	needProc(t)
	pid, _ := startWaiter(t, "a) (b) 1 2 3")
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	require.NoError(t, err)
	require.Contains(t, string(comm), ") (", "the kernel named it after the symlink")
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	rest, ok := bytes.CutPrefix(stat, []byte(strconv.Itoa(pid)+" ("+strings.TrimSuffix(string(comm), "\n")+") "))
	require.True(t, ok, "stat %q", stat)
	want, err := strconv.ParseUint(strings.Fields(string(rest))[19], 10, 64)
	require.NoError(t, err)

	got, err := startTime(pid)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	mine, err := startTime(os.Getpid())
	require.NoError(t, err)
	assert.GreaterOrEqual(t, got, mine, "started after this process")
}

// A process that has ended and been waited for has no start time.
func TestStartTimeGone(t *testing.T) {
	needProc(t)
	cmd := osexec.Command(os.Args[0]) // its stdin is empty: it ends at once
	cmd.Env = append(os.Environ(), waitEnv+"=1")
	require.NoError(t, cmd.Run())
	_, err := startTime(cmd.Process.Pid)
	assert.ErrorIs(t, err, fs.ErrNotExist)
}

// This process's LabelOwner names it: its space, PID and start time.
func TestOwnerSelf(t *testing.T) {
	needProc(t)
	o, ok := parseOwner(self())
	require.True(t, ok, "self() = %q", self())
	assert.Equal(t, os.Getpid(), o.pid)
	start, err := startTime(os.Getpid())
	require.NoError(t, err)
	assert.Equal(t, start, o.start)
	assert.Equal(t, o.space, ownSpace())
	assert.Equal(t, self(), self(), "computed once")

	// Judged with the real /proc: alive; a PID reused; a process gone.
	chk := newOwnerCheck()
	assert.Empty(t, chk.gone(map[string]string{LabelOwner: self()}))
	o.start++
	assert.Contains(t, chk.gone(map[string]string{LabelOwner: o.String()}), "now names another process")
	pid, end := startWaiter(t, "podvm-owner")
	start, err = startTime(pid)
	require.NoError(t, err)
	child := owner{space: ownSpace(), pid: pid, start: start}.String()
	assert.Empty(t, chk.gone(map[string]string{LabelOwner: child}), "alive")
	require.NoError(t, end())
	assert.Equal(t, fmt.Sprintf("owner process %d is gone", pid), chk.gone(map[string]string{LabelOwner: child}))
}

func TestParseOwner(t *testing.T) {
	o, ok := parseOwner("0123456789abcdef.42.1234")
	assert.True(t, ok)
	assert.Equal(t, owner{space: "0123456789abcdef", pid: 42, start: 1234}, o)
	assert.Equal(t, "0123456789abcdef.42.1234", o.String())
	for _, bad := range []string{"", "0123456789abcdef.42", "0123456789abcdef.42.1234.5", "0123456789ABCDEF.42.1234",
		"0123456789abcde.42.1234", "0123456789abcdef.0.1234", "0123456789abcdef.-1.1234", "0123456789abcdef.+42.1234",
		"0123456789abcdef.42.", "0123456789abcdef..1234", "0123456789abcdef.42.x", "0123456789abcdef.99999999999.1"} {
		_, ok := parseOwner(bad)
		assert.False(t, ok, "%q", bad)
	}
}

// fakeProc is a machine's processes as an ownerCheck sees them.
type fakeProc struct {
	start map[int]uint64 // /proc/PID/stat's start time
	err   map[int]error  // or its error
	alive map[int]bool   // signal 0 finds it
}

func (p fakeProc) check(space, host string) ownerCheck {
	return ownerCheck{space: space, host: host,
		start: func(pid int) (uint64, error) {
			if err, ok := p.err[pid]; ok {
				return 0, err
			}
			if s, ok := p.start[pid]; ok {
				return s, nil
			}
			return 0, fmt.Errorf("open /proc/%d/stat: %w", pid, fs.ErrNotExist)
		},
		alive: func(pid int) bool { return p.alive[pid] || p.start[pid] != 0 },
	}
}

func TestOwnerGone(t *testing.T) {
	const (
		ours   = "00000000000000aa"
		theirs = "00000000000000bb"
		host   = "ci"
	)
	proc := fakeProc{
		start: map[int]uint64{100: 5000, 101: 6000},
		err: map[int]error{
			200: &fs.PathError{Op: "open", Path: "/proc/200/stat", Err: syscall.EACCES},
			201: &fs.PathError{Op: "open", Path: "/proc/201/stat", Err: syscall.EPERM},
			202: &fs.PathError{Op: "open", Path: "/proc/202/stat", Err: syscall.ENOENT},
		},
		alive: map[int]bool{202: true}, // hidden from /proc (hidepid=invisible), found by signal 0
	}
	own := func(space string, pid int, start uint64) string { return owner{space, pid, start}.String() }
	legacy := func(pid, host string) map[string]string {
		return map[string]string{LabelOwnerPID: pid, LabelOwnerHost: host}
	}
	with := func(l map[string]string, owner string) map[string]string {
		l[LabelOwner] = owner
		return l
	}
	only := func(owner string) map[string]string { return map[string]string{LabelOwner: owner} }
	for _, c := range []struct {
		name   string
		space  string // ours
		labels map[string]string
		want   string // "" when not gone
	}{
		{"alive", ours, with(legacy("100", host), own(ours, 100, 5000)), ""},
		{"gone", ours, with(legacy("300", host), own(ours, 300, 5000)), "owner process 300 is gone"},
		{"PID reused", ours, with(legacy("100", host), own(ours, 100, 4000)), "owner process 100 is gone (its PID now names another process)"},
		{"another space, same hostname, dead PID", ours, with(legacy("300", host), own(theirs, 300, 5000)), ""},
		{"another space, a live PID of ours", ours, with(legacy("100", host), own(theirs, 100, 1)), ""},
		{"hidepid: EACCES", ours, only(own(ours, 200, 5000)), ""},
		{"hidepid: EPERM", ours, only(own(ours, 201, 5000)), ""},
		{"hidepid=invisible: signal 0 finds it", ours, only(own(ours, 202, 5000)), ""},
		{"we have no space", "", with(legacy("300", host), own(ours, 300, 5000)), ""},
		{"no legacy labels needed", ours, only(own(ours, 300, 1)), "owner process 300 is gone"},

		{"malformed: legacy judges, gone", ours, with(legacy("300", host), ours+".300"), "owner process 300 is gone"},
		{"malformed: legacy judges, alive", ours, with(legacy("101", host), "x.101.6000"), ""},
		{"empty: legacy judges", "", with(legacy("300", host), ""), "owner process 300 is gone"},
		{"legacy: gone", ours, legacy("300", host), "owner process 300 is gone"},
		{"legacy: alive", ours, legacy("100", host), ""},
		{"legacy: reused PID looks alive", ours, legacy("101", host), ""},
		{"legacy: another host", ours, legacy("300", "elsewhere"), ""},
		{"legacy: no pid", ours, legacy("", host), ""},
		{"legacy: pid 0", ours, legacy("0", host), ""},
		{"no labels", ours, map[string]string{}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, proc.check(c.space, host).gone(c.labels))
		})
	}
}

func TestReapReason(t *testing.T) {
	const ours = "00000000000000aa"
	chk := fakeProc{start: map[int]uint64{100: 5000}}.check(ours, "ci")
	now := time.Unix(1_000_000, 0)
	box := func(ended bool, owner string, created int64) driver.Container {
		return driver.Container{ID: "x", Ended: ended, Labels: map[string]string{LabelManaged: "true",
			LabelOwner: owner, LabelCreated: strconv.FormatInt(created, 10)}}
	}
	live, dead := ours+".100.5000", ours+".300.1"
	foreign := "00000000000000bb.300.1"
	for _, c := range []struct {
		name      string
		box       driver.Container
		olderThan time.Duration
		want      string
	}{
		{"live owner, young", box(false, live, 999_990), time.Hour, ""},
		{"live owner, no age rule", box(false, live, 1), 0, ""},
		{"live owner, old", box(false, live, 990_000), time.Hour, "created 2h46m40s ago"},
		{"dead owner", box(false, dead, 999_990), time.Hour, "owner process 300 is gone"},
		{"foreign owner, young", box(false, foreign, 999_990), time.Hour, ""},
		{"foreign owner, old", box(false, foreign, 990_000), time.Hour, "created 2h46m40s ago"},
		{"ended, live owner", box(true, live, 999_990), 0, "it has ended"},
		{"ended, foreign owner", box(true, foreign, 999_990), 0, "it has ended"},
		{"not podvm's, ended", driver.Container{ID: "x", Ended: true, Labels: map[string]string{LabelOwner: dead}}, 0, ""},
		{"not podvm's, dead owner", driver.Container{ID: "x", Labels: map[string]string{LabelManaged: "false", LabelOwner: dead}}, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, reapReason(c.box, chk, now, c.olderThan))
		})
	}
}

func TestManagedLabels(t *testing.T) {
	needProc(t)
	extra := map[string]string{"app": "x", LabelManaged: "no", LabelOwner: "someone"}
	before := time.Now().Unix()
	l := ManagedLabels(extra)
	assert.Equal(t, map[string]string{"app": "x", LabelManaged: "no", LabelOwner: "someone"}, extra, "extra is not changed")
	assert.Equal(t, "x", l["app"])
	assert.Equal(t, "true", l[LabelManaged], "podvm's labels win")
	assert.Equal(t, self(), l[LabelOwner])
	assert.Equal(t, strconv.Itoa(os.Getpid()), l[LabelOwnerPID])
	host, _ := os.Hostname()
	assert.Equal(t, host, l[LabelOwnerHost])
	created, err := strconv.ParseInt(l[LabelCreated], 10, 64)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, created, before)
	assert.Equal(t, ManagedLabels(nil)[LabelOwner], self(), "nil extra")

	// What Reap makes of them: ours while this process lives, and the
	// same as a sandbox's.
	c := driver.Container{ID: "x", Labels: l}
	assert.Empty(t, reapReason(c, newOwnerCheck(), time.Now(), 0))
	assert.Equal(t, Config{Labels: map[string]string{"app": "x"}}.labels()[LabelOwner], l[LabelOwner])
}
