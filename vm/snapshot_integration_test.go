package vm_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	osexec "os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

// snapTestLabel labels a test's snapshots and sandboxes, so that they can
// be listed, and removes every snapshot carrying it when the test ends.
func snapTestLabel(t *testing.T, env podmantest.Env) (string, string) {
	t.Helper()
	v := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, id := range strings.Fields(podman(ctx, t, env, "images", "-q", "--no-trunc", "--filter", "label=io.podvm.test="+v)) {
			podmanIgnore(ctx, env, "rmi", "-f", id)
		}
	})
	return "io.podvm.test", v
}

// snapSetup gives a test its deadline and the label of its snapshots.
func snapSetup(t *testing.T, env podmantest.Env) (context.Context, string, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	k, w := snapTestLabel(t, env)
	return ctx, k, w
}

// onBothBackends runs test on APIVM and on CLIVM (through the agent), in
// parallel subtests.
func onBothBackends(t *testing.T, env podmantest.Env, test func(t *testing.T, name string, h vmtest.Harness)) {
	for name, h := range map[string]vmtest.Harness{"api": apiHarness(env, false), "cli": cliHarness(env, false)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, name, h)
		})
	}
}

// podmanIgnore runs podman against env's service, whatever it answers.
func podmanIgnore(ctx context.Context, env podmantest.Env, args ...string) string {
	res, err := exec.NewCommandExecutor().Run(ctx, exec.Command{Name: "podman", Args: append([]string{"--url", env.Host}, args...)})
	if err != nil {
		return ""
	}
	return res.Stdout
}

// imageExists reports whether env's service has image ref.
func imageExists(ctx context.Context, env podmantest.Env, ref string) bool {
	res, err := exec.NewCommandExecutor().Run(ctx, exec.Command{Name: "podman", Args: []string{"--url", env.Host, "image", "exists", ref}})
	return err == nil && res.ExitCode == 0
}

// prepared is a created sandbox of h that wrote /var/prep/cache.
func prepared(ctx context.Context, t *testing.T, h vmtest.Harness, cfg vm.Config) vm.VM {
	t.Helper()
	v, err := h.NewVM(t, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, v.Remove(context.Background())) })
	require.NoError(t, v.Create(ctx))
	res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "mkdir -p /var/prep && echo warmed > /var/prep/cache"}})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, res.Stderr)
	return v
}

// Names: podvm's own, the caller's, one taken from an image podvm did
// not make (refused, unless Replace), one moved from an older snapshot
// (which goes), and removal refused for an image that is not a snapshot.
func TestSnapshotNames(t *testing.T) {
	env := podmantest.Need(t)
	onBothBackends(t, env, func(t *testing.T, name string, h vmtest.Harness) {
		ctx, k, w := snapSetup(t, env)
		labels := map[string]string{k: w}
		v := prepared(ctx, t, h, vm.Config{Labels: labels})
		testImageID := strings.TrimSpace(podman(ctx, t, env, "image", "inspect", "--format", "{{.Id}}", env.Image))

		// The caller's name, completed as Podman completes it.
		mine := "podvm-snaptest-" + strings.ToLower(name) + "-" + strconv.Itoa(os.Getpid())
		first, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: mine, Labels: labels})
		require.NoError(t, err)
		assert.Equal(t, "localhost/"+mine+":latest", first.Image)
		assert.True(t, imageExists(ctx, env, first.Image))

		// The same name again: it moves to the new snapshot, and the
		// old one, unused, is removed.
		_, err = v.Run(ctx, exec.Command{Name: "touch", Args: []string{"/var/prep/second"}})
		require.NoError(t, err)
		second, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: mine, Labels: labels})
		require.NoError(t, err)
		assert.NotEqual(t, first.ID, second.ID)
		assert.False(t, imageExists(ctx, env, first.ID), "the snapshot whose name moved is left behind")

		// An image podvm did not make: refused, and untouched.
		_, err = vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: env.Image, Labels: labels})
		require.ErrorIs(t, err, vm.ErrImageExists)
		assert.Contains(t, err.Error(), "Replace")
		assert.Equal(t, testImageID, strings.TrimSpace(podman(ctx, t, env, "image", "inspect", "--format", "{{.Id}}", env.Image)))

		// A name Podman would resolve as an image ID (here the test
		// image's): refused before any call, nothing made. Given to
		// RemoveSnapshot, a full ID is an ID; a part of one, refused.
		_, err = vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: testImageID, Labels: labels})
		require.ErrorIs(t, err, vm.ErrInvalidSnapshot)
		assert.False(t, imageExists(ctx, env, "localhost/"+testImageID+":latest"), "a snapshot named as an ID was made")
		require.ErrorIs(t, vm.RemoveSnapshot(ctx, v, testImageID), vm.ErrNotSnapshot)
		require.ErrorIs(t, vm.RemoveSnapshot(ctx, v, testImageID[:12]), vm.ErrInvalidSnapshot)

		// Unless asked: a name of the user's (a tag of the test
		// image) moves; the image keeps its ID and other names.
		users := "localhost/podvm-snaptest-users-" + strings.ToLower(name) + ":" + strconv.Itoa(os.Getpid())
		podman(ctx, t, env, "tag", env.Image, users)
		t.Cleanup(func() { podmanIgnore(context.Background(), env, "rmi", users) })
		_, err = vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: users, Labels: labels})
		require.ErrorIs(t, err, vm.ErrImageExists)
		taken, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: users, Replace: true, Labels: labels})
		require.NoError(t, err)
		assert.Equal(t, users, taken.Image)
		assert.True(t, imageExists(ctx, env, testImageID), "the user's image was removed")
		assert.True(t, imageExists(ctx, env, env.Image))

		// Removal refuses what is not a snapshot.
		err = vm.RemoveSnapshot(ctx, v, env.Image)
		require.ErrorIs(t, err, vm.ErrNotSnapshot)
		assert.True(t, imageExists(ctx, env, env.Image))

		// Listed, with their labels.
		list, err := vm.ListSnapshots(ctx, vm.WithURL(env.Host), vm.WithLabel(k, w))
		require.NoError(t, err)
		var ids []string
		for _, s := range list {
			ids = append(ids, s.ID)
			assert.Equal(t, v.ID(), s.Source)
			assert.Equal(t, os.Getpid(), s.OwnerPID)
		}
		assert.ElementsMatch(t, []string{second.ID, taken.ID}, ids)

		require.NoError(t, vm.RemoveSnapshot(ctx, v, second.Image))
		require.NoError(t, vm.RemoveSnapshot(ctx, v, taken.Image))
		assert.False(t, imageExists(ctx, env, second.ID))
	})
}

// A pool makes its sandboxes from a snapshot like from any image.
func TestSnapshotPool(t *testing.T) {
	env := podmantest.Need(t)
	ctx, k, w := snapSetup(t, env)
	v := prepared(ctx, t, apiHarness(env, false), vm.Config{})
	snap, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Labels: map[string]string{k: w}})
	require.NoError(t, err)
	p, err := vm.NewPool(vm.Config{Image: snap.Image}, newAPIOn(env), vm.WithPoolSize(2))
	require.NoError(t, err)
	for range 3 {
		box, err := p.Get(ctx)
		require.NoError(t, err)
		res, err := box.Run(ctx, exec.Command{Name: "cat", Args: []string{"/var/prep/cache"}})
		require.NoError(t, err)
		assert.Equal(t, "warmed\n", res.Stdout)
		require.NoError(t, box.Remove(ctx))
	}
	require.NoError(t, p.Close(ctx))
	require.NoError(t, vm.RemoveSnapshot(ctx, v, snap.Image))
}

// The agent bind-mounted at /.podvm (a local service) is not in the
// snapshot: beneath a sandbox's own agent, the image's /.podvm is an
// empty mount point, as a Podman exec sandbox, which has no agent, shows.
func TestSnapshotLeavesTheMountedAgentOut(t *testing.T) {
	env := podmantest.Need(t)
	ctx, k, w := snapSetup(t, env)
	v := prepared(ctx, t, apiHarness(env, false), vm.Config{})
	res, err := v.Run(ctx, exec.Command{Name: "grep", Args: []string{" /.podvm ", "/proc/mounts"}})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, "the agent is not bind-mounted here: %s", res.Stdout)
	snap, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Labels: map[string]string{k: w}})
	require.NoError(t, err)
	defer vm.RemoveSnapshot(context.Background(), v, snap.Image)
	x := prepared(ctx, t, apiHarness(env, true), vm.Config{Image: snap.Image})
	res, err = x.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "ls -A /.podvm; cat /var/prep/cache"}})
	require.NoError(t, err)
	assert.Equal(t, "warmed\n", res.Stdout, "/.podvm holds something")
}

// With a remote service the agent is copied into the container's layer,
// so the snapshot holds it (as documented); a sandbox made from it gets
// its own copied over it, and works.
func TestSnapshotRemoteHoldsTheCopiedAgent(t *testing.T) {
	env := podmantest.Need(t)
	podmantest.NeedBinary(t, "podman")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	env.Host = startService(t, fmt.Sprintf("tcp://127.0.0.1:%d", port)).uri
	ctx, k, w := snapSetup(t, env)
	v := prepared(ctx, t, apiHarness(env, false), vm.Config{})
	snap, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Labels: map[string]string{k: w}})
	require.NoError(t, err)
	defer vm.RemoveSnapshot(context.Background(), v, snap.Image)
	x := prepared(ctx, t, apiHarness(env, true), vm.Config{Image: snap.Image})
	res, err := x.Run(ctx, exec.Command{Name: "ls", Args: []string{"-A", "/.podvm"}})
	require.NoError(t, err)
	assert.NotEmpty(t, strings.TrimSpace(res.Stdout), "the copied agent is not in the snapshot")
	y := prepared(ctx, t, apiHarness(env, false), vm.Config{Image: snap.Image})
	res, err = y.Run(ctx, exec.Command{Name: "cat", Args: []string{"/var/prep/cache"}})
	require.NoError(t, err)
	assert.Equal(t, "warmed\n", res.Stdout)
}

// A sandbox removed while its snapshot is taken: the snapshot either
// completed, or failed with an error and left no image.
func TestSnapshotSandboxRemovedMidway(t *testing.T) {
	env := podmantest.Need(t)
	onBothBackends(t, env, func(t *testing.T, name string, h vmtest.Harness) {
		ctx, k, w := snapSetup(t, env)
		v := prepared(ctx, t, h, vm.Config{})
		// A layer that takes a moment to commit.
		res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "dd if=/dev/urandom of=/var/prep/big bs=1M count=48 2>/dev/null"}})
		require.NoError(t, err)
		require.Equal(t, 0, res.ExitCode)
		ref := "localhost/podvm-snaptest-midway-" + name + ":" + strconv.Itoa(os.Getpid())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(50 * time.Millisecond)
			assert.NoError(t, h.RemoveContainer(ctx, v.ID()))
		}()
		snap, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: ref, Labels: map[string]string{k: w}})
		wg.Wait()
		t.Logf("snapshot: %v", err)
		if err != nil && !errors.Is(err, vm.ErrNoSuchContainer) && !errors.Is(err, vm.ErrPodman) {
			t.Errorf("snapshot of a sandbox removed midway: %v; want ErrNoSuchContainer, or Podman's failure", err)
		}
		if err == nil {
			require.NoError(t, vm.RemoveSnapshot(ctx, v, snap.Image))
			return
		}
		assert.False(t, imageExists(ctx, env, ref), "a failed snapshot left its image")
		list, lerr := vm.ListSnapshots(ctx, vm.WithURL(env.Host), vm.WithLabel(k, w))
		require.NoError(t, lerr)
		assert.Empty(t, list, "a failed snapshot left an image")
	})
}

// Reap with WithSnapshots removes the snapshots of gone owners, and no
// other image: not a live owner's, not one of another PID namespace of
// the same hostname, not another host's (legacy labels), not an image
// without podvm's snapshot label, not one a container uses.
func TestReapSnapshots(t *testing.T) {
	env := podmantest.Need(t)
	ctx, k, w := snapSetup(t, env)
	v := prepared(ctx, t, apiHarness(env, false), vm.Config{})
	dead := osexec.Command("true")
	require.NoError(t, dead.Run())
	deadPID := strconv.Itoa(dead.Process.Pid)
	host, _ := os.Hostname()
	// This process's owner label, as its sandbox carries it.
	me := strings.TrimSpace(podman(ctx, t, env, "inspect", "--format", `{{index .Config.Labels "`+vm.LabelOwner+`"}}`, v.ID()))
	parts := strings.Split(me, ".")
	require.Len(t, parts, 3, "owner label %q", me)
	start, err := strconv.ParseUint(parts[2], 10, 64)
	require.NoError(t, err)
	reused := parts[0] + "." + parts[1] + "." + strconv.FormatUint(start+1, 10)
	twin := "0123456789abcdef." + deadPID + ".1" // another PID namespace, the same hostname
	// mk commits the sandbox with these labels; owner "" is a legacy
	// snapshot's (an empty label hides the sandbox's).
	mk := func(tag string, snapshot, pid, owner, ownerHost string) string {
		args := []string{"commit", "-q", "--pause=false"}
		for _, l := range []string{vm.LabelSnapshot + "=" + snapshot, vm.LabelOwner + "=" + owner, vm.LabelOwnerPID + "=" + pid, vm.LabelOwnerHost + "=" + ownerHost, vm.LabelManaged + "=", k + "=" + w} {
			args = append(args, "--change", "LABEL "+l)
		}
		return strings.TrimSpace(podman(ctx, t, env, append(args, v.ID(), "localhost/podvm-snaptest-reap:"+tag+"-"+strconv.Itoa(os.Getpid()))...))
	}
	deadOne := mk("dead", "true", deadPID, "", host)
	deadNew := mk("dead-new", "true", deadPID, parts[0]+"."+deadPID+".1", host)
	reusedOne := mk("reused", "true", parts[1], reused, host)
	live := mk("live", "true", strconv.Itoa(os.Getpid()), "", host)
	liveNew := mk("live-new", "true", deadPID, me, host) // LabelOwner decides alone
	twinOne := mk("twin", "true", deadPID, twin, host)
	elsewhere := mk("elsewhere", "true", deadPID, "", "elsewhere.example")
	users := mk("users", "", deadPID, "", host)
	used := mk("used", "true", deadPID, "", host)
	ctr := strings.TrimSpace(podman(ctx, t, env, "create", "--label", k+"="+w, used, "true"))
	t.Cleanup(func() { podmanIgnore(context.Background(), env, "rm", "-f", ctr) })

	removed, err := vm.Reap(ctx, 0, vm.WithURL(env.Host), vm.WithSnapshots(), vm.WithLabel(k, w))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{deadOne, deadNew, reusedOne}, removed)
	for _, id := range []string{deadOne, deadNew, reusedOne} {
		assert.False(t, imageExists(ctx, env, id), "Reap left %s", id)
	}
	for _, id := range []string{live, liveNew, twinOne, elsewhere, users, used} {
		assert.True(t, imageExists(ctx, env, id), "Reap removed %s", id)
	}
	// Without the option, no image is touched.
	podman(ctx, t, env, "rm", "-f", ctr)
	removed, err = vm.Reap(ctx, 0, vm.WithURL(env.Host), vm.WithLabel(k, w))
	require.NoError(t, err)
	assert.Empty(t, removed)
	assert.True(t, imageExists(ctx, env, used))
	removed, err = vm.Reap(ctx, 0, vm.WithURL(env.Host), vm.WithSnapshots(), vm.WithLabel(k, w))
	require.NoError(t, err)
	assert.Equal(t, []string{used}, removed)
	assert.False(t, slices.Contains(removed, users))
}

// A sandbox writing to its own filesystem while its snapshot is taken:
// the writer goes on undisturbed, the snapshot succeeds, and it holds
// what had been written when Podman read it (a prefix of the file).
func TestSnapshotWhileWriting(t *testing.T) {
	env := podmantest.Need(t)
	onBothBackends(t, env, func(t *testing.T, name string, h vmtest.Harness) {
		ctx, k, w := snapSetup(t, env)
		v := prepared(ctx, t, h, vm.Config{})
		var wg sync.WaitGroup
		var res *exec.Result
		var err error
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err = v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c",
				"i=0; while [ $i -lt 64 ]; do dd if=/dev/zero bs=1M count=1 2>/dev/null >> /var/prep/growing; i=$((i+1)); done; wc -c < /var/prep/growing"}})
		}()
		time.Sleep(100 * time.Millisecond)
		snap, serr := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Labels: map[string]string{k: w}})
		wg.Wait()
		require.NoError(t, serr)
		require.NoError(t, err)
		assert.Equal(t, strconv.Itoa(64<<20)+"\n", res.Stdout, "the writer was disturbed: %s", res.Stderr)
		x := prepared(ctx, t, h, vm.Config{Image: snap.Image})
		got, err := x.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "wc -c < /var/prep/growing; cat /var/prep/cache"}})
		require.NoError(t, err)
		lines := strings.Fields(got.Stdout)
		require.Len(t, lines, 2, got.Stdout+got.Stderr)
		n, _ := strconv.Atoi(lines[0])
		assert.LessOrEqual(t, n, 64<<20)
		assert.Equal(t, "warmed", lines[1])
		t.Logf("the snapshot caught %d of %d bytes", n, 64<<20)
		require.NoError(t, x.Remove(ctx))
		require.NoError(t, vm.RemoveSnapshot(ctx, v, snap.Image))
	})
}

// A snapshot whose storage fills up midway (Podman writes the layer to a
// temporary file first; here its TMPDIR is a 1 MiB tmpfs, a disk full
// without filling the machine's) fails with Podman's error and leaves no
// image; the sandbox runs on. The local podman only: a service's commit
// writes where the service's TMPDIR says.
func TestSnapshotStorageFull(t *testing.T) {
	env := podmantest.Need(t)
	x, mode := cliMode(env)
	if x == nil {
		t.Skip("needs the local podman: the commit's temporary files are the client's")
	}
	podmantest.NeedBinary(t, "unshare")
	small := t.TempDir()
	if out, err := osexec.Command("unshare", "-m", "sh", "-c", `mount -t tmpfs -o size=1m tmpfs "$0"`, small).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs in a mount namespace of its own: %v %s", err, out)
	}
	wrapper := small + ".podman"
	require.NoError(t, os.WriteFile(wrapper, []byte(`#!/bin/sh
for a in "$@"; do
	if [ "$a" = commit ]; then
		exec unshare -m sh -c 'p=$1; shift; mount -t tmpfs -o size=1m tmpfs "$0" && TMPDIR="$0" exec "$p" "$@"' "`+small+`" "`+env.Podman+`" "$@"
	fi
done
exec "`+env.Podman+`" "$@"
`), 0o755))
	t.Cleanup(func() { os.Remove(wrapper) })
	ctx, k, w := snapSetup(t, env)
	v, err := vm.NewCLIVM(vm.Config{Image: env.Image}, x, append(mode, vm.WithPodman(wrapper))...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, v.Remove(context.Background())) })
	require.NoError(t, v.Create(ctx))
	res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "dd if=/dev/urandom of=/big bs=1M count=8 2>/dev/null"}})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode)

	ref := "localhost/podvm-snaptest-full:" + strconv.Itoa(os.Getpid())
	_, err = vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: ref, Labels: map[string]string{k: w}})
	require.ErrorIs(t, err, vm.ErrPodman)
	var cerr *vm.CLIError
	require.ErrorAs(t, err, &cerr, "Podman's own message is reachable")
	t.Logf("snapshot: %v", err)
	assert.Contains(t, cerr.Stderr, "storing layer", "not the storage failure this test makes")
	assert.Contains(t, cerr.Stderr, "storing layer", "not the storage failure this test makes")
	assert.False(t, imageExists(ctx, env, ref), "a failed snapshot left its image")
	list, err := vm.ListSnapshots(ctx, vm.WithURL(env.Host), vm.WithLabel(k, w))
	require.NoError(t, err)
	assert.Empty(t, list, "a failed snapshot left an image")
	res, err = v.Run(ctx, exec.Command{Name: "echo", Args: []string{"still here"}})
	require.NoError(t, err)
	assert.Equal(t, "still here\n", res.Stdout)
}
