// Package podmantest gates podvm's integration tests on a real Podman
// service: it skips them when none is configured, and fails them instead
// under CI=true or PODVM_REQUIRE_PODMAN=1, so CI can never pass by
// skipping. `make test` configures the service (scripts/podman-up.sh).
package podmantest

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/testkit"
)

// Env is the Podman service and image the integration tests use.
type Env struct {
	// Host is the service URI, from CONTAINER_HOST (unix://, tcp://, ssh://).
	Host string
	// Image is the test image, from PODVM_TEST_IMAGE.
	Image string
	// Podman is the podman binary for the CLI backend, from PODVM_PODMAN
	// (the test matrix points it at Podman 5's client), else "podman".
	Podman string
	// RemoteOnly: Podman can only reach the service remotely, from
	// PODVM_PODMAN_REMOTE=1 (Podman 5's client in the matrix). Otherwise
	// it can also run locally, on the service's storage.
	RemoteOnly bool
	// PidsUnenforced: the service is rootless Podman without the pids
	// cgroup controller (cgroup v1, say), which refuses every pids
	// limit: the suite's sandboxes that ask for none run with
	// vm.NoPidsLimit there.
	PidsUnenforced bool
}

// Required reports whether a missing Podman must fail tests rather than
// skip them.
func Required() bool { return testkit.Required(requireEnv) }

// requireEnv is the variable that, set to 1, makes a missing Podman fail
// the tests as CI=true does.
const requireEnv = "PODVM_REQUIRE_PODMAN"

// Need returns the configured service, or skips t (fails it when
// [Required]) naming the variables that would enable the test.
func Need(t testing.TB) Env {
	t.Helper()
	e := Env{
		Host:       os.Getenv("CONTAINER_HOST"),
		Image:      os.Getenv("PODVM_TEST_IMAGE"),
		Podman:     os.Getenv("PODVM_PODMAN"),
		RemoteOnly: os.Getenv("PODVM_PODMAN_REMOTE") == "1",
	}
	if e.Podman == "" {
		e.Podman = "podman"
	}
	if e.Host == "" || e.Image == "" {
		skipOrFail(t, "integration test needs Podman: set CONTAINER_HOST and PODVM_TEST_IMAGE (`eval \"$(scripts/podman-up.sh)\"`, or run `make test`)")
	}
	e.PidsUnenforced = pidsUnenforced(t, e.Host)
	return e
}

// unenforced caches pidsUnenforced by service.
var unenforced sync.Map

// pidsUnenforced asks the service at host whether it is rootless Podman
// without the pids controller.
func pidsUnenforced(t testing.TB, host string) bool {
	if v, ok := unenforced.Load(host); ok {
		return v.(bool)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := libpod.Connect(ctx, host)
	if err != nil {
		skipOrFail(t, fmt.Sprintf("Podman at %s: %v", host, err))
	}
	defer c.CloseIdleConnections()
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatalf("Podman at %s: %v", host, err)
	}
	v := info.Host.Security.Rootless && !slices.Contains(info.Host.CgroupControllers, "pids")
	unenforced.Store(host, v)
	return v
}

// NeedSSH returns $PODVM_SSH_URL, the ssh:// URL of a Podman service
// whose host is in $HOME/.ssh/known_hosts (`eval "$(scripts/ssh-up.sh)"`
// sets both), or skips t. It fails t instead under PODVM_REQUIRE_SSH=1,
// or when [Required] on the matrix's ssh row (PODVM_SERVER=ssh): the
// other rows have no sshd, so CI=true alone does not require one.
func NeedSSH(t testing.TB) string {
	t.Helper()
	u := os.Getenv("PODVM_SSH_URL")
	if !strings.HasPrefix(u, "ssh://") {
		msg := fmt.Sprintf("test needs Podman over ssh: set PODVM_SSH_URL to an ssh:// URL (`eval \"$(scripts/ssh-up.sh)\"`), not %q", u)
		if os.Getenv("PODVM_REQUIRE_SSH") == "1" || (Required() && os.Getenv("PODVM_SERVER") == "ssh") {
			t.Fatal(msg + "; failing because PODVM_REQUIRE_SSH=1, or CI=true on the ssh row")
		}
		t.Skip(msg)
	}
	return u
}

// NeedBinary returns the path of the program name, or skips t (fails it
// when [Required]): `make podman` installs every program the tests need.
func NeedBinary(t testing.TB, name string) string {
	t.Helper()
	path, err := osexec.LookPath(name)
	if err != nil {
		skipOrFail(t, fmt.Sprintf("test needs %s: %v (`make podman` installs it)", name, err))
	}
	return path
}

func skipOrFail(t testing.TB, msg string) {
	t.Helper()
	testkit.SkipOrFail(t, requireEnv, msg)
}

// stateDir is the scripts' state directory, $PODVM_STATE or the
// repository's .podvm, with symlinks resolved.
var stateDir = func() string {
	_, file, _, _ := runtime.Caller(0)
	dir := cmp.Or(os.Getenv("PODVM_STATE"), filepath.Join(filepath.Dir(file), "..", "..", ".podvm"))
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		return real
	}
	return filepath.Clean(dir)
}()

// Samples is the directory of podman's recorded failures,
// CASE.EXITCODE.txt each holding what podman printed on stderr.
var Samples = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "podman-stderr")
}()

// Sample is the Result of a podman command that printed nothing on stdout
// and the recorded sample name (in [Samples]) on stderr, and exited with
// the status the name gives.
func Sample(t testing.TB, name string) *exec.Result {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Samples, name))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Split(name, ".")
	code, err := strconv.Atoi(f[len(f)-2])
	if err != nil {
		t.Fatalf("sample %s: names are CASE.EXITCODE.txt", name)
	}
	return &exec.Result{Stderr: string(b), StderrBytes: int64(len(b)), ExitCode: code}
}

// TempDirs are the host directories where podman, client or service,
// puts what it spools: os.TempDir() and /var/tmp.
func TempDirs() []string { return []string{os.TempDir(), "/var/tmp"} }

// A TempWatch finds data written into [TempDirs] after it began, reading
// only what changed since then: its cost depends on what a case did, not
// on what else the machine keeps in its temporary directories.
//
// Podman spools into a temporary directory as os.CreateTemp and
// os.MkdirTemp do: a new entry of the directory, or a new directory with
// its own entries. A watch looks at those: the entries of each directory
// changed since it began, and beneath them, those changed too. A
// directory that did not change is not entered.
type TempWatch struct {
	since time.Time
	dirs  []string
}

// WatchTemp begins a watch of [TempDirs].
func WatchTemp() TempWatch { return watch(TempDirs()...) }

func watch(dirs ...string) TempWatch {
	// A second back: a file system's timestamps may be coarser than
	// the clock.
	return TempWatch{since: time.Now().Add(-time.Second), dirs: dirs}
}

// Holding returns the regular files, up to 64 MiB each, written since the
// watch began, that hold marker: where data written into a sandbox must
// not have been left on the host.
func (w TempWatch) Holding(marker string) []string {
	var found []string
	for _, dir := range w.dirs {
		found = append(found, w.holding(dir, []byte(marker))...)
	}
	return found
}

func (w TempWatch) holding(dir string, marker []byte) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var found []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		info, err := e.Info()
		if err != nil || !w.changed(info) {
			continue
		}
		switch {
		case e.IsDir() && p == stateDir:
			// The project's own services keep their storage here (Podman
			// 5's, the cluster's containerd), and with it the sandboxes'
			// own filesystems: not copies on the host. A clone in the
			// temporary directory puts it inside dir.
		case e.IsDir():
			found = append(found, w.holding(p, marker)...)
		case info.Mode().IsRegular() && info.Size() <= 64<<20:
			if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, marker) {
				found = append(found, p)
			}
		}
	}
	return found
}

// changed reports whether info's file was made or written, or a
// directory's entries changed, since the watch began: by its inode's
// change time where there is one, which no copy that keeps a file's times
// can set back.
func (w TempWatch) changed(info fs.FileInfo) bool {
	return !changeTime(info).Before(w.since)
}
