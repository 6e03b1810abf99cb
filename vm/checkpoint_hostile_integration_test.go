package vm_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
)

// The failure cases of checkpoints, where they work (the Podman 5.4
// rig); elsewhere TestCheckpointRestore and TestSuspendResume show the
// refusal. In each, the sandbox goes on as it was, and nothing is left
// behind: no file but whole checkpoints, no container but the copies
// returned.

// checkpointRig skips t where checkpoints do not work, and returns the
// Podman service's environment.
func checkpointRig(t *testing.T) podmantest.Env {
	env := podmantest.Need(t)
	if os.Getenv("PODVM_SERVER") != "podman5" {
		t.Skip("checkpoints work on the Podman 5.4 rig alone (PODVM_SERVER=podman5); TestCheckpointRestore shows the refusal here")
	}
	noTraces(t, env)
	return env
}

// noTraces checks, once t and its subtests are done (their sandboxes and
// copies removed), that the service keeps nothing of a container it no
// longer has: no conmon watching it, no mount of its (the shm of its
// userdata), and no image but those it had when t began. The mounts are
// those of the mount namespace of the rig's service (service.pid beside
// its socket).
func noTraces(t *testing.T, env podmantest.Env) {
	ctx := context.Background()
	images := podman(ctx, t, env, "images", "-a", "-q", "--no-trunc")
	socket := strings.TrimPrefix(env.Host, "unix://")
	pid, err := os.ReadFile(filepath.Join(filepath.Dir(socket), "service.pid"))
	require.NoError(t, err, "the rig's service.pid, beside its socket")
	mountinfo := filepath.Join("/proc", strings.TrimSpace(string(pid)), "mountinfo")
	t.Cleanup(func() {
		var left []string
		var lastErr error
		ok := assert.Eventually(t, func() bool {
			left = nil
			traces, err := containerTraces(filepath.Dir(socket), mountinfo) // before the list: a container made meanwhile is in it
			if lastErr = err; err != nil {
				return false
			}
			res, err := exec.NewCommandExecutor().Run(ctx, exec.Command{Name: "podman", Args: []string{"--url", env.Host, "ps", "-a", "-q", "--no-trunc"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("podman ps: %s", res.Stderr)
			}
			if lastErr = err; err != nil {
				return false
			}
			live := map[string]bool{}
			for _, id := range strings.Fields(res.Stdout) {
				live[id] = true
			}
			for id, where := range traces {
				if !live[id] {
					left = append(left, id[:12]+": "+where)
				}
			}
			return len(left) == 0
		}, 30*time.Second, 100*time.Millisecond)
		if !ok {
			t.Errorf("left of containers the service no longer has: %v (%v)", left, lastErr)
		}
		assert.ElementsMatch(t, strings.Fields(images), strings.Fields(podman(ctx, t, env, "images", "-a", "-q", "--no-trunc")), "the service's images are those it had")
	})
}

// containerIDRE is a container's ID in the path of its userdata.
var containerIDRE = regexp.MustCompile(`overlay-containers/([0-9a-f]{64})/`)

// containerTraces returns the containers that have a conmon of the rig's
// service (whose state is in rig: its conmons name its storage there;
// those of other services on this machine do not) or a mount in its
// mount namespace (mountinfo), each with where it was found.
func containerTraces(rig, mountinfo string) (map[string]string, error) {
	found := map[string]string{}
	all, err := conmonArgvs()
	if err != nil {
		return nil, err
	}
	for pid, argv := range all {
		if !slices.ContainsFunc(argv, func(a string) bool { return strings.Contains(a, rig+"/") }) {
			continue
		}
		for i, a := range argv {
			if (a == "-c" || a == "--cid") && i+1 < len(argv) && len(argv[i+1]) == 64 {
				found[argv[i+1]] = "conmon pid " + pid
			}
		}
	}
	mounts, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, err
	}
	for _, id := range containerIDs(mounts) {
		if found[id] == "" {
			found[id] = "mounted in the service"
		} else if !strings.HasSuffix(found[id], "mounted in the service") {
			found[id] += ", and mounted in the service"
		}
	}
	return found, nil
}

// containerIDs returns the container IDs of the userdata paths in b.
func containerIDs(b []byte) []string {
	var ids []string
	for _, m := range containerIDRE.FindAllSubmatch(b, -1) {
		if len(m[1]) > 0 {
			ids = append(ids, string(m[1]))
		}
	}
	return ids
}

// eachBackend runs test on the API backend and the CLI backend at once,
// each with a ctx of its own that ends after deadline: name is the
// backend's (for backendOf), h makes its VMs.
func eachBackend(t *testing.T, env podmantest.Env, deadline time.Duration, test func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness)) {
	for name, h := range map[string]func(bool) vmHarness{"api": apiNew(env), "cli": cliNew(env)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			test(ctx, t, name, h)
		})
	}
}

// warmVM is a created sandbox with a process held by handle that
// counts the lines it reads.
func warmVM(ctx context.Context, t *testing.T, env podmantest.Env, h vmHarness) (vm.VM, *vm.Process) {
	t.Helper()
	v := testVM(t, env, h)
	require.NoError(t, v.Create(ctx))
	p, err := vm.Start(ctx, v, exec.Command{Name: "sh", Args: []string{"-c", `n=0; while read l; do n=$((n+1)); echo "$n $l"; done`}})
	require.NoError(t, err)
	return v, p
}

// stillRuns checks that v and its held process p answer as before:
// the process has counted n lines, and counts one more.
func stillRuns(ctx context.Context, t *testing.T, v vm.VM, p *vm.Process, n int) {
	t.Helper()
	res, err := v.Run(ctx, exec.Command{Name: "echo", Args: []string{"alive"}})
	require.NoError(t, err)
	assert.Equal(t, "alive\n", res.Stdout)
	_, err = p.Stdin().Write([]byte("x\n"))
	require.NoError(t, err)
	want := fmt.Sprintf("%d x\n", n+1)
	require.Eventually(t, func() bool { return strings.HasSuffix(outputOf(p), want) }, 30*time.Second, 10*time.Millisecond,
		"the held process went on: want %q, have %q", want, outputOf(p))
}

// onlyWhole checks that dir holds whole checkpoints alone: a .json for
// every .tar, nothing half-written.
func onlyWhole(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	names := map[string]bool{}
	for _, e := range entries {
		names[e.Name()] = true
	}
	for n := range names {
		id, tar := strings.CutSuffix(n, ".tar")
		json, meta := strings.CutSuffix(n, ".json")
		switch {
		case tar:
			assert.True(t, names[id+".json"], "%s without its metadata", n)
		case meta:
			assert.True(t, names[json+".tar"], "%s without its archive", n)
		default:
			t.Errorf("%s left in the checkpoint directory", n)
		}
	}
}

// copiesOf lists the containers restored from checkpoint id.
func copiesOf(ctx context.Context, t *testing.T, env podmantest.Env, id string) []string {
	return strings.Fields(podman(ctx, t, env, "ps", "-a", "-q", "--no-trunc", "--filter", "label="+vm.LabelRestoredFrom+"="+id))
}

// A sandbox holding what CRIU cannot dump (a TCP socket, on this rig's
// CRIU 4.1 and Linux 6.18): the checkpoint fails naming the socket and
// its process, and so does Suspend; the sandbox runs on, and nothing is
// written.
func TestCheckpointUndumpable(t *testing.T) {
	env := checkpointRig(t)
	eachBackend(t, env, 3*time.Minute, func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness) {
		dir := checkpointDir(t)
		v, p := warmVM(ctx, t, env, h(false))
		nc, err := vm.Start(ctx, v, exec.Command{Name: "nc", Args: []string{"-ll", "-p", "8080", "-e", "cat"}}) // busybox's: it listens on
		require.NoError(t, err)
		require.NoError(t, vm.WaitListening(ctx, v, "tcp", "127.0.0.1:8080"))

		_, err = vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir})
		t.Logf("TakeCheckpoint: %v", err)
		require.ErrorIs(t, err, vm.ErrPodman)
		assert.ErrorContains(t, err, fmt.Sprintf("pid %d (nc) listening on", nc.PID()), "the error names the process and its socket")
		stillRuns(ctx, t, v, p, 0)
		onlyWhole(t, dir)
		entries, _ := os.ReadDir(dir)
		assert.Empty(t, entries)

		err = vm.Suspend(ctx, v)
		t.Logf("Suspend: %v", err)
		require.ErrorIs(t, err, vm.ErrPodman)
		assert.ErrorContains(t, err, "(nc) listening on")
		stillRuns(ctx, t, v, p, 1)

		require.NoError(t, nc.Kill())
		_, _ = nc.Wait(ctx)
		cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir})
		require.NoError(t, err, "once the socket is closed")
		assert.FileExists(t, cp.Path)
	})
}

// ctx ending at any point of a checkpoint or a restore leaves the
// sandbox running as it was, whole checkpoints alone, and no container
// but the copies returned.
func TestCheckpointCancelled(t *testing.T) {
	env := checkpointRig(t)
	eachBackend(t, env, 5*time.Minute, func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness) {
		dir := checkpointDir(t)
		v, p := warmVM(ctx, t, env, h(false))
		var cp *vm.Checkpoint
		n := 0
		for _, d := range []time.Duration{0, time.Millisecond, 30 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond, time.Second, 3 * time.Second} {
			cctx, ccancel := context.WithTimeout(ctx, d)
			got, err := vm.TakeCheckpoint(cctx, v, vm.CheckpointOptions{Dir: dir})
			ccancel()
			t.Logf("TakeCheckpoint within %v: %v", d, err)
			if err != nil {
				require.ErrorIs(t, err, context.DeadlineExceeded)
			} else {
				cp = got
			}
			stillRuns(ctx, t, v, p, n)
			n++
			onlyWhole(t, dir)
		}
		if cp == nil {
			var err error
			cp, err = vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir})
			require.NoError(t, err)
		}
		var made []vm.VM
		for _, d := range []time.Duration{0, time.Millisecond, 30 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond, time.Second, 3 * time.Second} {
			cctx, ccancel := context.WithTimeout(ctx, d)
			c, err := vm.Restore(cctx, cp, vm.RestoreOptions{}, backendOf(env, name)...)
			ccancel()
			t.Logf("Restore within %v: %v", d, err)
			if err != nil {
				require.ErrorIs(t, err, context.DeadlineExceeded)
				continue
			}
			made = append(made, c)
			t.Cleanup(func() { assert.NoError(t, c.Remove(context.Background())) })
			res, err := c.Run(ctx, exec.Command{Name: "echo", Args: []string{"copy"}})
			require.NoError(t, err)
			assert.Equal(t, "copy\n", res.Stdout)
		}
		var want []string
		for _, c := range made {
			want = append(want, c.ID())
		}
		assert.ElementsMatch(t, want, copiesOf(ctx, t, env, cp.ID), "no container but the copies returned")
		onlyWhole(t, dir)
	})
}

// A sandbox removed while its checkpoint is taken: Remove waits for the
// checkpoint, which is whole, or the checkpoint finds it removed; either
// way nothing is left of the sandbox, and no half-written file.
func TestCheckpointRemovedDuring(t *testing.T) {
	env := checkpointRig(t)
	eachBackend(t, env, 3*time.Minute, func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness) {
		dir := checkpointDir(t)
		for _, after := range []time.Duration{0, 50 * time.Millisecond, 200 * time.Millisecond} {
			v, _ := warmVM(ctx, t, env, h(false))
			id := v.ID()
			done := make(chan error, 1)
			go func() {
				_, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir})
				done <- err
			}()
			time.Sleep(after)
			require.NoError(t, v.Remove(ctx))
			err := <-done
			t.Logf("removed after %v: TakeCheckpoint: %v", after, err)
			if err != nil {
				require.ErrorIs(t, err, vm.ErrRemoved)
			}
			assert.Empty(t, strings.TrimSpace(podman(ctx, t, env, "ps", "-a", "-q", "--filter", "id="+id)))
			onlyWhole(t, dir)
		}
	})
}

// A checkpoint whose image the service no longer has is not restored,
// and nothing is made: the archive holds the sandbox's layer on top of
// that image, exactly, which a pull could not promise.
func TestRestoreImageGone(t *testing.T) {
	env := checkpointRig(t)
	eachBackend(t, env, 3*time.Minute, func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness) {
		dir := checkpointDir(t)
		image := "localhost/podvm-ckpt-gone:" + name + fmt.Sprint(time.Now().UnixNano())
		podman(ctx, t, env, "tag", env.Image, image)
		cfg := vm.Config{Image: image, Pull: vm.PullNever}
		if env.PidsUnenforced {
			cfg.Pids = vm.NoPidsLimit
		}
		v, err := h(false)(cfg)
		require.NoError(t, err)
		require.NoError(t, v.Create(ctx))
		cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir, Remove: true})
		require.NoError(t, err)
		assert.Equal(t, image, cp.Image)
		podman(ctx, t, env, "rmi", image) // untags: the test image keeps its other name

		_, err = vm.Restore(ctx, cp, vm.RestoreOptions{}, backendOf(env, name)...)
		t.Logf("Restore: %v", err)
		require.ErrorIs(t, err, vm.ErrImageNotFound)
		assert.ErrorContains(t, err, image)
		assert.Empty(t, copiesOf(ctx, t, env, cp.ID))
	})
}

// A checkpoint with Remove stops the sandbox at its instant: nothing its
// processes do after it is done but by the copies. A process numbers the
// lines it appends to a file of a bind mount, which the copy shares; had
// the original run on between the dump and its removal, the copy would
// write numbers the original had written already.
func TestCheckpointRemoveStops(t *testing.T) {
	env := checkpointRig(t)
	eachBackend(t, env, 3*time.Minute, func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness) {
		dir := checkpointDir(t)
		shared, err := os.MkdirTemp(cmp.Or(os.Getenv("PODVM_TEST_MOUNT_DIR"), os.TempDir()), "seq-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(shared) })
		require.NoError(t, os.Chmod(shared, 0o777))
		cfg := vm.Config{Image: env.Image, Checkpointable: true, Mounts: []vm.Mount{{Source: shared, Target: "/shared"}}}
		if env.PidsUnenforced {
			cfg.Pids = vm.NoPidsLimit
		}
		v, err := h(false)(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, v.Remove(context.Background())) })
		require.NoError(t, v.Create(ctx))
		_, err = vm.Start(ctx, v, exec.Command{Name: "sh", Args: []string{"-c", `i=0; while :; do i=$((i+1)); echo $i >>/shared/seq; usleep 500; done`}})
		require.NoError(t, err)
		seq := filepath.Join(shared, "seq")
		require.Eventually(t, func() bool { b, _ := os.ReadFile(seq); return len(b) > 100 }, 30*time.Second, 10*time.Millisecond)

		cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir, Remove: true})
		require.NoError(t, err)
		_, err = v.Run(ctx, exec.Command{Name: "true"})
		require.ErrorIs(t, err, vm.ErrRemoved)
		before, err := os.ReadFile(seq)
		require.NoError(t, err)

		c, err := vm.Restore(ctx, cp, vm.RestoreOptions{}, backendOf(env, name)...)
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, c.Remove(context.Background())) })
		require.Eventually(t, func() bool { b, _ := os.ReadFile(seq); return len(b) > len(before)+100 }, 30*time.Second, 10*time.Millisecond, "the copy goes on writing")
		b, err := os.ReadFile(seq)
		require.NoError(t, err)
		seen := map[string]bool{}
		var twice []string
		for _, n := range strings.Fields(string(b)) {
			if seen[n] {
				twice = append(twice, n)
			}
			seen[n] = true
		}
		assert.Empty(t, twice, "numbers written by both the original, after the checkpoint, and the copy")
	})
}

// A checkpoint whose archive was cut short (a disk that filled while it
// was copied, say) is not restored, and nothing is made, on either
// backend: the archive is checked before anything is sent. (That a
// rewrite failing mid-stream ends the API's upload with an error,
// TestImportRewritten shows.)
func TestRestoreCutArchive(t *testing.T) {
	env := checkpointRig(t)
	eachBackend(t, env, 3*time.Minute, func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness) {
		dir := checkpointDir(t)
		v, _ := warmVM(ctx, t, env, h(false))
		cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir})
		require.NoError(t, err)
		fi, err := os.Stat(cp.Path)
		require.NoError(t, err)
		require.NoError(t, os.Truncate(cp.Path, fi.Size()/2))

		_, err = vm.Restore(ctx, cp, vm.RestoreOptions{}, backendOf(env, name)...)
		t.Logf("Restore: %v", err)
		require.ErrorIs(t, err, vm.ErrInvalidCheckpoint)
		assert.Empty(t, copiesOf(ctx, t, env, cp.ID))
	})
}
