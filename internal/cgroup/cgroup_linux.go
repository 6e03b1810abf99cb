package cgroup

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Parent is a cgroup v2 under which run cgroups are created.
type Parent struct {
	dir          string
	memory, pids bool // controllers the run cgroups get
}

var seq atomic.Int64

// Find returns the parent for run cgroups: dir when it is not empty, else
// the calling process's own cgroup v2. It fails with [ErrUnavailable]
// unless a child cgroup can be created there and has cgroup.kill (Linux
// 5.14+). It enables the memory and pids controllers for children where
// the parent's cgroup.subtree_control allows it (it does not when the
// parent holds processes and is not a root), removes what runs of
// processes that no longer exist left behind, and starts this process's
// watcher for dir (see [watch]): a /bin/sh that lives as long as the
// process.
func Find(dir string) (*Parent, error) {
	if dir == "" {
		var err error
		if dir, err = own(); err != nil {
			return nil, err
		}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, fmt.Errorf("%w: %s is not a cgroup v2 directory", ErrUnavailable, dir)
	}
	probe := filepath.Join(dir, newName("podvm-probe-"))
	if err := os.Mkdir(probe, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	_, err := os.Stat(filepath.Join(probe, "cgroup.kill"))
	os.Remove(probe)
	if err != nil {
		return nil, fmt.Errorf("%w: %s has no cgroup.kill (Linux 5.14 or later needed)", ErrUnavailable, dir)
	}
	p := &Parent{dir: dir}
	p.enable()
	p.sweep()
	watch(dir)
	return p, nil
}

// watchScript is the watcher [watch] starts. It reads its stdin until
// EOF, which comes when the process image that started it is gone (it
// died, however, or exec'd another program); then it kills every run
// cgroup whose name starts with $1 and removes those (one holding cgroups
// of its own is left to the next sweep). Signals sent to a terminal's
// group or a session do not stop it.
const watchScript = `trap '' HUP INT QUIT TERM PIPE
while read -r _; do :; done
p=$1; set --
for d in "$p"*; do [ -d "$d" ] && echo 1 >"$d/cgroup.kill" && set -- "$@" "$d"; done 2>/dev/null
n=0
while [ $n -lt 50 ]; do
  left=
  for d; do [ -d "$d" ] && { rmdir "$d" 2>/dev/null || left=1; }; done
  [ -z "$left" ] && exit 0
  n=$((n+1)); sleep 0.1 2>/dev/null || sleep 1
done`

// watchers holds, per parent directory, the write end of the pipe whose
// read end is its watcher's stdin: it is never written to, and closes
// only when this process image ends (it is close-on-exec, so no child
// holds it).
var watchers struct {
	sync.Mutex
	pipes map[string]*os.File
}

// watch starts, once per parent directory and process, a watcher that
// kills this process's run cgroups under dir when the process dies
// mid-run: a caller that crashes leaves no run alive. The watcher is in
// the caller's cgroup, in a session of its own: what kills the caller's
// whole cgroup kills it too (with a parent outside that cgroup, the runs
// then live on), and so does an outer subreaper's sweep. Where /bin/sh
// cannot be started, or the watcher is gone, the next [Find] on dir (in
// any process of this PID namespace) sweeps them instead.
func watch(dir string) {
	watchers.Lock()
	defer watchers.Unlock()
	if watchers.pipes[dir] != nil {
		return
	}
	r, w, err := os.Pipe()
	if err != nil {
		return
	}
	defer r.Close()
	// Its $0 names it in ps; its own argv[0] stays sh (busybox reads it).
	c := osexec.Command("/bin/sh", "-c", watchScript, "podvm-cgroup-watch", dir+"/podvm-"+instance()+"-")
	c.Dir, c.Env = "/", []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	c.Stdin = r
	c.SysProcAttr = &unix.SysProcAttr{Setsid: true} // out of the caller's group and session
	if err := c.Start(); err != nil {
		w.Close()
		return
	}
	if watchers.pipes == nil {
		watchers.pipes = map[string]*os.File{}
	}
	watchers.pipes[dir] = w
	go func() {
		// It exits while this process lives only when it failed or was
		// killed: reap it, and let the next Find on dir start another.
		c.Wait()
		watchers.Lock()
		delete(watchers.pipes, dir)
		watchers.Unlock()
		w.Close()
	}()
}

// own returns the directory of the calling process's cgroup v2.
func own() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	var path string
	for line := range strings.Lines(string(data)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			path = p
		}
	}
	if !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("%w: the process is in no cgroup v2 hierarchy", ErrUnavailable)
	}
	mounts, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer mounts.Close()
	sc := bufio.NewScanner(mounts)
	for sc.Scan() {
		// id parent dev root mountpoint opts... - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		root, mnt := f[3], f[4]
		if rel, ok := strings.CutPrefix(path, root); ok && (root == "/" || rel == "" || rel[0] == '/') {
			return filepath.Join(mnt, rel), nil
		}
	}
	return "", fmt.Errorf("%w: the process's cgroup %s is not mounted", ErrUnavailable, path)
}

// enable turns on the memory and pids controllers for children, where the
// parent allows it, and records which are on.
func (p *Parent) enable() {
	on := p.subtree()
	avail, _ := os.ReadFile(filepath.Join(p.dir, "cgroup.controllers"))
	for _, c := range []string{"memory", "pids"} {
		if !on[c] && has(string(avail), c) {
			_ = write(filepath.Join(p.dir, "cgroup.subtree_control"), "+"+c)
		}
	}
	on = p.subtree()
	p.memory, p.pids = on["memory"], on["pids"]
}

func (p *Parent) subtree() map[string]bool {
	data, _ := os.ReadFile(filepath.Join(p.dir, "cgroup.subtree_control"))
	on := map[string]bool{}
	for _, c := range strings.Fields(string(data)) {
		on[c] = true
	}
	return on
}

func has(list, name string) bool {
	for _, c := range strings.Fields(list) {
		if c == name {
			return true
		}
	}
	return false
}

// instance names this process image's run cgroups, "podvm-" + instance
// + "-" + a sequence number: PIDNS-PID-TOKEN, the inode of the process's
// PID namespace ("0" when it cannot be read), its pid there, and a random
// token, which a re-executed image, same pid, does not share.
var instance = sync.OnceValue(func() string {
	ns := "0"
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/pid", &st) == nil {
		ns = strconv.FormatUint(st.Ino, 10)
	}
	var tok [4]byte
	_, _ = rand.Read(tok[:])
	return ns + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(tok[:])
})

// newName returns a new cgroup name of this process image: prefix,
// instance, a sequence number.
func newName(prefix string) string {
	return prefix + instance() + "-" + strconv.FormatInt(seq.Add(1), 10)
}

// sweep kills and removes the run cgroups of process images that are gone
// (a caller that crashed mid-run, or re-executed itself). Only names of
// this process's PID namespace are looked at: a pid of another one, which
// shares the parent, says nothing here; where the namespace is not known,
// nothing is swept.
func (p *Parent) sweep() {
	me := strings.Split(instance(), "-")
	if me[0] == "0" {
		return
	}
	ents, _ := os.ReadDir(p.dir)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "podvm-")
		if !ok || !e.IsDir() {
			continue
		}
		f := strings.Split(strings.TrimPrefix(rest, "probe-"), "-")
		if len(f) != 4 || f[0] != me[0] || f[1] == me[1] && f[2] == me[2] {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 {
			continue
		}
		// The same pid with another token is an image this one replaced.
		if f[1] != me[1] && !errors.Is(unix.Kill(pid, 0), unix.ESRCH) {
			continue
		}
		_ = (&Run{dir: filepath.Join(p.dir, e.Name()), fd: -1, cpu: -1, peak: -1}).Remove()
	}
}

// Dir is the parent's directory.
func (p *Parent) Dir() string { return p.dir }

// Controllers reports whether run cgroups get the memory and the pids
// controller, without which [Limits] cannot be enforced.
func (p *Parent) Controllers() (memory, pids bool) { return p.memory, p.pids }

// Run is one run's cgroup.
type Run struct {
	dir    string
	fd     int  // O_PATH descriptor of dir, for clone's CLONE_INTO_CGROUP
	memory bool // it has the memory controller

	// cpu.stat and memory.peak, opened when the cgroup is made so that the
	// usage read at the end of a run costs no path walk (-1: not open).
	cpu, peak int
}

// New creates an empty run cgroup with the given limits. The caller must
// call [Run.Finish] or [Run.Remove]. A limit whose controller the parent
// does not give children is an error.
func (p *Parent) New(l Limits) (*Run, error) {
	if (l.MemoryBytes > 0 && !p.memory) || (l.Pids > 0 && !p.pids) {
		return nil, fmt.Errorf("cgroup: %s does not give its children the controller a limit needs", p.dir)
	}
	r := &Run{dir: p.dir + "/" + newName("podvm-"), fd: -1, cpu: -1, peak: -1, memory: p.memory}
	if err := unix.Mkdir(r.dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup: %w", &os.PathError{Op: "mkdir", Path: r.dir, Err: err})
	}
	err := r.limit(l)
	if err == nil {
		r.fd, err = unix.Open(r.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	if err == nil {
		r.cpu, err = unix.Openat(r.fd, "cpu.stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err == nil && r.memory {
		r.peak, _ = unix.Openat(r.fd, "memory.peak", unix.O_RDONLY|unix.O_CLOEXEC, 0) // Linux 5.19+
	}
	if err != nil {
		r.Remove()
		return nil, fmt.Errorf("cgroup: %s: %w", r.dir, err)
	}
	return r, nil
}

func (r *Run) limit(l Limits) error {
	if l.MemoryBytes > 0 {
		if err := write(filepath.Join(r.dir, "memory.max"), strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return err
		}
		// Without swap accounting there is no such file, and nothing to cap.
		if err := write(filepath.Join(r.dir, "memory.swap.max"), "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if l.Pids > 0 {
		return write(filepath.Join(r.dir, "pids.max"), strconv.FormatInt(l.Pids, 10))
	}
	return nil
}

// FD is the cgroup's directory descriptor, for SysProcAttr.CgroupFD.
func (r *Run) FD() int { return r.fd }

// Kill kills every process in the cgroup, atomically: a process forking
// while it is killed cannot escape.
func (r *Run) Kill() { _ = write(filepath.Join(r.dir, "cgroup.kill"), "1") }

// usage returns the CPU time the cgroup's processes spent in user and
// kernel mode, and its peak memory in bytes, or -1 without the memory
// controller (memory.peak, Linux 5.19+).
func (r *Run) usage() (user, system time.Duration, peak int64) {
	var buf [1024]byte
	data := r.read(r.cpu, "cpu.stat", buf[:])
	for line := range strings.Lines(string(data)) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "user_usec":
			user = time.Duration(n) * time.Microsecond
		case "system_usec":
			system = time.Duration(n) * time.Microsecond
		}
	}
	peak = -1
	if r.memory {
		if n, err := strconv.ParseInt(string(bytes.TrimSpace(r.read(r.peak, "memory.peak", buf[:]))), 10, 64); err == nil {
			peak = n
		}
	}
	return user, system, peak
}

// emptyWait bounds how long wait waits for killed processes to exit.
const emptyWait = 10 * time.Second

// populated reports whether a live process is in the cgroup (a cgroup
// holding only zombies is not populated).
func (r *Run) populated() bool {
	var buf [256]byte
	return !bytes.Contains(read(filepath.Join(r.dir, "cgroup.events"), buf[:]), []byte("populated 0"))
}

// wait kills what is left in the cgroup and waits until it is empty.
func (r *Run) wait() error {
	pause := 20 * time.Microsecond
	for start := time.Now(); r.populated(); {
		if _, err := os.Stat(r.dir); err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
		if time.Since(start) > emptyWait {
			return fmt.Errorf("cgroup: %s still has processes after %v", r.dir, emptyWait)
		}
		r.Kill()
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
	return nil
}

// Finish ends the run's cgroup: it kills what is left in it, waits for it
// to be empty, returns its usage (see [Run.usage]) and removes it. The
// common case, a cgroup already empty, costs one read and one rmdir.
func (r *Run) Finish() (user, system time.Duration, peak int64, err error) {
	user, system, peak = r.usage()
	r.close()
	err = unix.Rmdir(r.dir)
	if errors.Is(err, unix.EBUSY) { // processes or cgroups left: the uncommon case
		if err = r.wait(); err != nil {
			return user, system, peak, err
		}
		user, system, peak = r.usage()
		err = removeTree(r.dir)
	}
	if err != nil {
		err = fmt.Errorf("cgroup: removing %s: %w", r.dir, err)
	}
	return user, system, peak, err
}

// Remove removes the cgroup, first killing what is left in it and waiting
// for it to be empty.
func (r *Run) Remove() error {
	r.close()
	err := unix.Rmdir(r.dir)
	if errors.Is(err, unix.EBUSY) {
		if err = r.wait(); err == nil {
			err = removeTree(r.dir)
		}
	}
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cgroup: removing %s: %w", r.dir, err)
	}
	return nil
}

// close closes the descriptors the run holds on its cgroup; after it,
// [Run.usage] reads the files by path.
func (r *Run) close() {
	for _, fd := range []*int{&r.fd, &r.cpu, &r.peak} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// read reads the cgroup file name through fd, its descriptor, or by path
// when it has none, into buf; nil when it cannot.
func (r *Run) read(fd int, name string, buf []byte) []byte {
	if fd < 0 {
		return read(filepath.Join(r.dir, name), buf)
	}
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// removeTree removes an empty cgroup and the cgroups the run made under
// it, deepest first.
func removeTree(dir string) error {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			removeTree(filepath.Join(dir, e.Name()))
		}
	}
	return unix.Rmdir(dir)
}

// read reads a small cgroup file into buf, returning nil when it cannot.
func read(path string, buf []byte) []byte {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// write writes s to a cgroup file, which must exist.
func write(path, s string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(s)); err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}
