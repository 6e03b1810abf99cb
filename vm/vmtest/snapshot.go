package vmtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// snapshotSentinels are the errors of snapshots an observation names,
// before those of [observe].
var snapshotSentinels = []error{vm.ErrInvalidSnapshot, vm.ErrImageExists, vm.ErrNotSnapshot, vm.ErrSnapshotInUse, vm.ErrImageNotFound,
	vm.ErrNotCreated, vm.ErrRemoved, vm.ErrNoSuchContainer}

// observeSnapshot records the outcome of a snapshot call: the sentinel
// err matches, or none.
func observeSnapshot(label string, err error) observation {
	if err == nil {
		return observation{Label: label, Result: &exec.Result{}}
	}
	for _, s := range snapshotSentinels {
		if errors.Is(err, s) {
			return observation{Label: label, Err: s.Error()}
		}
	}
	return observe(label, nil, err)
}

// snapshotCases are the conformance cases of snapshots ([vm.TakeSnapshot],
// [vm.RemoveSnapshot]): what a snapshot holds, what it does not, and
// how a sandbox is started from it.
func snapshotCases(h Harness) []testCase {
	return []testCase{
		holdsTheLayer(h),
		{Name: "snapshot/read-only-tmpfs", Promise: "under ReadOnlyRootfs what the sandbox writes lands on tmpfs, which no snapshot holds",
			Config:   func(c *vm.Config) { c.ReadOnlyRootfs = true },
			Deadline: 2 * time.Minute,
			Test:     snapshotReadOnly(h)},
		{Name: "snapshot/run-in-flight", Promise: "a snapshot does not pause the sandbox: a Run in flight finishes undisturbed, and the sandbox runs on",
			Deadline: 2 * time.Minute,
			Test:     snapshotRunInFlight},
		{Name: "snapshot/remove", Promise: "a snapshot a sandbox uses cannot be removed (ErrSnapshotInUse); once it is gone it can, and then it is ErrImageNotFound",
			Deadline: 2 * time.Minute,
			Test:     snapshotRemove(h)},
		{Name: "snapshot/lifecycle", Promise: "a snapshot before Create is ErrNotCreated, after Remove ErrRemoved, of a container removed behind the VM's back ErrNoSuchContainer, leaving no image",
			Uncreated: true, Deadline: 2 * time.Minute,
			Test: snapshotLifecycle(h)},
		{Name: "snapshot/invalid", Promise: "a name that is not an image reference, that Podman would take for an image ID, or a label Podman would change, is ErrInvalidSnapshot before Podman is called, to take a snapshot or to remove one",
			Test: snapshotInvalid},
		{Name: "snapshot/same-name-at-once", Promise: "snapshots taken at once under one name leave one image under it and no other: the images that lost the name go, and the one a sandbox uses goes once the sandbox and the name are removed",
			Deadline: 3 * time.Minute,
			Test:     snapshotSameNameAtOnce(h)},
	}
}

// takeSnapshot snapshots v, removing the snapshot when the test ends;
// it skips t when v cannot take snapshots.
func takeSnapshot(ctx context.Context, t *testing.T, v vm.VM, opts vm.SnapshotOptions) *vm.Snapshot {
	t.Helper()
	snap, err := vm.TakeSnapshot(ctx, v, opts)
	if err != nil {
		skipIfNotSupported(t, err)
		t.Fatalf("TakeSnapshot: %v", err)
	}
	t.Cleanup(func() { removeSnapshot(t, v, snap.Image) })
	return snap
}

// removeSnapshot removes snapshot ref, if it is still there.
func removeSnapshot(t *testing.T, v vm.VM, ref string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A backend that cannot snapshot (Kubernetes) made nothing to remove.
	if err := vm.RemoveSnapshot(ctx, v, ref); err != nil && !errors.Is(err, vm.ErrImageNotFound) && !errors.Is(err, vm.ErrNotSupported) {
		t.Errorf("removing snapshot %s: %v", ref, err)
	}
}

// fromSnapshot creates a sandbox of cfg from snap, removed when the test
// ends (before the snapshot).
func fromSnapshot(ctx context.Context, t *testing.T, h Harness, snap *vm.Snapshot, cfg vm.Config) vm.VM {
	t.Helper()
	cfg.Image = snap.Image
	v, err := h.NewVM(t, cfg)
	if err != nil {
		t.Fatalf("new VM from snapshot %s: %v", snap.Image, err)
	}
	t.Cleanup(func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := v.Remove(rctx); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	if err := v.Create(ctx); err != nil {
		t.Fatalf("Create from snapshot %s: %v", snap.Image, err)
	}
	return v
}

// MountDirer is implemented by a [Harness] whose Podman sees only some
// directories of the test's host (a service in a mount namespace of its
// own): MountDir names one that it can bind-mount. Without it, cases
// that bind-mount a host directory make it in [os.TempDir].
type MountDirer interface {
	MountDir() string
}

// mountDir is where a case makes a host directory to bind-mount.
func mountDir(h Harness) string {
	if m, ok := h.(MountDirer); ok {
		return m.MountDir()
	}
	return os.TempDir()
}

// holdsTheLayer is the case of what a snapshot holds; the source has a
// bind mount of a host directory of its own.
func holdsTheLayer(h Harness) testCase {
	return testCase{Name: "snapshot/holds-the-layer", Promise: "a sandbox from a snapshot has the files the source wrote to its own filesystem and its Config.Env, not its bind mounts' files, its processes, a Run's Env or podvm's bind-mounted agent",
		Setup: func(t *testing.T, c *vm.Config) {
			d, err := os.MkdirTemp(mountDir(h), "podvm-snap-")
			if err != nil {
				t.Fatal(err)
			}
			// Removed whatever happens: a backend that refuses the
			// mount never runs Test.
			t.Cleanup(func() { os.RemoveAll(d) })
			_ = os.WriteFile(filepath.Join(d, "from-host"), []byte("host"), 0o644)
			_ = os.Chmod(d, 0o777) // for any user of the sandbox
			c.Mounts = []vm.Mount{{Source: d, Target: "/mnt/host"}}
			c.Env = []string{"PREPARED_BY=config"}
		},
		Deadline: 2 * time.Minute,
		Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
			return snapshotHoldsTheLayer(ctx, t, h, v)
		}}
}

func snapshotHoldsTheLayer(ctx context.Context, t *testing.T, h Harness, v vm.VM) []observation {
	prep := sh(`mkdir -p /var/prep && echo warmed > /var/prep/cache && echo in-tmp > /tmp/t &&
			echo on-host > /mnt/host/written && (setsid sleep 3012 >/dev/null 2>&1 &) &&
			if grep -q ' /.podvm ' /proc/mounts; then echo mounted; elif [ -e /.podvm ]; then echo copied; else echo none; fi`)
	prep.Env = []string{"SECRET_TOKEN=s3cret"} // the Run's own: in no snapshot
	res, err := v.Run(ctx, prep)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("preparing: %v %+v", err, res)
	}
	agentWas := strings.TrimSpace(res.Stdout)
	snap := takeSnapshot(ctx, t, v, vm.SnapshotOptions{})
	if !strings.HasPrefix(snap.Image, "localhost/podvm-snapshot:") || snap.ID == "" || snap.Source != v.ID() {
		t.Errorf("snapshot %+v: want a name podvm chose, an ID, and the source %s", snap, v.ID())
	}
	if snap.Labels[vm.LabelSnapshot] != "true" || snap.Labels[vm.LabelManaged] != "" || snap.OwnerPID != os.Getpid() || snap.Created.IsZero() {
		t.Errorf("snapshot labels %v, owner %d, created %v: want podvm's snapshot labels, this process, a time", snap.Labels, snap.OwnerPID, snap.Created)
	}
	// The source runs on, and can still change without the snapshot
	// seeing it.
	res, err = v.Run(ctx, sh(`echo later > /var/prep/later`))
	want(t, res, err, "", "", 0)

	w := fromSnapshot(ctx, t, h, snap, vm.Config{})
	res, err, o := run(ctx, w, "from snapshot", sh(`cat /var/prep/cache /tmp/t; ls -A /mnt/host; ls /var/prep; echo "env: $PREPARED_BY ${SECRET_TOKEN:-none}"; ps -o args | grep -c '[s]leep 3012'`))
	want(t, res, err, "warmed\nin-tmp\ncache\nenv: config none\n0\n", "", 1)
	// What the image holds at /.podvm, where the new sandbox has no
	// agent of its own mounted over it (vm's own tests look beneath
	// one, with a Podman exec sandbox).
	res, err = w.Run(ctx, sh(`if grep -q ' /.podvm ' /proc/mounts; then echo mounted; else ls -A /.podvm 2>/dev/null | head -1; fi`))
	if err != nil {
		t.Fatalf("listing /.podvm: %v", err)
	}
	switch got := strings.TrimSpace(res.Stdout); {
	case got == "mounted":
	case agentWas == "copied" && got == "":
		t.Errorf("the agent was copied into the source's layer, so the snapshot holds it; /.podvm is empty")
	case agentWas != "copied" && got != "":
		t.Errorf("the agent was %s in the source; the snapshot's /.podvm must be empty or absent, lists %q", agentWas, got)
	}
	return []observation{o}
}

func snapshotReadOnly(h Harness) func(ctx context.Context, t *testing.T, v vm.VM) []observation {
	return func(ctx context.Context, t *testing.T, v vm.VM) []observation {
		res, err := v.Run(ctx, sh(`echo tmpfs > /tmp/t && echo run > /run/r && echo var > /var/tmp/v && ! touch /etc/x 2>/dev/null`))
		want(t, res, err, "", "", 0)
		snap := takeSnapshot(ctx, t, v, vm.SnapshotOptions{})
		w := fromSnapshot(ctx, t, h, snap, vm.Config{})
		res, err, o := run(ctx, w, "from snapshot", sh(`ls -A /tmp /var/tmp; ls /run/r /etc/x 2>/dev/null; echo end`))
		want(t, res, err, "/tmp:\n\n/var/tmp:\nend\n", "", 0)
		return []observation{o}
	}
}

func snapshotRunInFlight(ctx context.Context, t *testing.T, v vm.VM) []observation {
	var wg sync.WaitGroup
	var res *exec.Result
	var err error
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, err = v.Run(ctx, sh(`i=0; while [ $i -lt 20 ]; do echo $i; i=$((i+1)); sleep 0.1; done; echo done`))
	}()
	time.Sleep(300 * time.Millisecond)
	_ = takeSnapshot(ctx, t, v, vm.SnapshotOptions{})
	wg.Wait()
	var out strings.Builder
	for i := range 20 {
		fmt.Fprintf(&out, "%d\n", i)
	}
	out.WriteString("done\n")
	want(t, res, err, out.String(), "", 0)
	o := observe("in flight", res, err)
	res, err, o2 := run(ctx, v, "after", exec.Command{Name: "echo", Args: []string{"still here"}})
	want(t, res, err, "still here\n", "", 0)
	return []observation{o, o2}
}

func snapshotRemove(h Harness) func(ctx context.Context, t *testing.T, v vm.VM) []observation {
	return func(ctx context.Context, t *testing.T, v vm.VM) []observation {
		snap := takeSnapshot(ctx, t, v, vm.SnapshotOptions{Labels: map[string]string{"io.podvm.test": "remove"}})
		if snap.Labels["io.podvm.test"] != "remove" {
			t.Errorf("labels %v: want the one asked for", snap.Labels)
		}
		w := fromSnapshot(ctx, t, h, snap, vm.Config{})
		err := vm.RemoveSnapshot(ctx, v, snap.Image)
		obs := []observation{observeSnapshot("in use", err)}
		if !errors.Is(err, vm.ErrSnapshotInUse) || !strings.Contains(err.Error(), "remove it first") {
			t.Errorf("removing a snapshot a sandbox uses: %v; want ErrSnapshotInUse, saying what to do", err)
		}
		if err := w.Remove(ctx); err != nil {
			t.Fatal(err)
		}
		err = vm.RemoveSnapshot(ctx, v, snap.Image)
		obs = append(obs, observeSnapshot("unused", err))
		if err != nil {
			t.Errorf("removing an unused snapshot: %v", err)
		}
		err = vm.RemoveSnapshot(ctx, v, snap.Image)
		obs = append(obs, observeSnapshot("gone", err))
		if !errors.Is(err, vm.ErrImageNotFound) {
			t.Errorf("removing a snapshot twice: %v; want ErrImageNotFound", err)
		}
		return obs
	}
}

func snapshotLifecycle(h Harness) func(ctx context.Context, t *testing.T, v vm.VM) []observation {
	return func(ctx context.Context, t *testing.T, v vm.VM) []observation {
		name := "localhost/podvm-vmtest-snap:" + randomWord()
		_, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: name})
		obs := []observation{observeSnapshot("uncreated", err)}
		wantErr(t, "before Create", err, vm.ErrNotCreated)
		if err := v.Create(ctx); err != nil {
			t.Fatal(err)
		}
		if err := h.RemoveContainer(ctx, v.ID()); err != nil {
			t.Fatal(err)
		}
		_, err = vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: name})
		skipIfNotSupported(t, err) // a backend with no snapshots at all
		obs = append(obs, observeSnapshot("removed behind its back", err))
		wantErr(t, "container removed behind the VM's back", err, vm.ErrNoSuchContainer)
		err = vm.RemoveSnapshot(ctx, v, name)
		wantErr(t, "the failed snapshot's image", err, vm.ErrImageNotFound)
		if err := v.Remove(ctx); err != nil {
			t.Fatal(err)
		}
		_, err = vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: name})
		obs = append(obs, observeSnapshot("after Remove", err))
		wantErr(t, "after Remove", err, vm.ErrRemoved)
		return obs
	}
}

func snapshotInvalid(ctx context.Context, t *testing.T, v vm.VM) []observation {
	var obs []observation
	for _, o := range []vm.SnapshotOptions{
		{Name: "Upper/case"}, {Name: "-flag"}, {Name: "a b"}, {Name: "name@sha256:0123"}, {Name: "x:"}, {Name: "x:-tag"},
		{Name: "bad..dots"}, {Name: strings.Repeat("a", 256)}, {Name: "x/"},
		{Labels: map[string]string{"k": "a,b"}}, {Labels: map[string]string{"k": `"q"`}}, {Labels: map[string]string{"": "v"}},
		{Labels: map[string]string{"k": "two words"}},
		// Podman would resolve these as an image's ID, or a prefix of one.
		{Name: strings.Repeat("0123456789abcdef", 4)}, {Name: "abc"}, {Name: "cafe:v1"}, {Name: "sha256:" + strings.Repeat("ab", 32)},
	} {
		snap, err := vm.TakeSnapshot(ctx, v, o)
		if err == nil {
			removeSnapshot(t, v, snap.ID)
		}
		wantErr(t, "options "+o.Name, err, vm.ErrInvalidSnapshot)
		obs = append(obs, observeSnapshot(o.Name, err))
	}
	for _, ref := range []string{"", "-f", "a b", "UPPER", "x:tag:tag", "Upper/case", "abc", strings.Repeat("ab", 31), "sha256:abc"} {
		err := vm.RemoveSnapshot(ctx, v, ref)
		wantErr(t, "remove "+ref, err, vm.ErrInvalidSnapshot)
		obs = append(obs, observeSnapshot("remove "+ref, err))
	}
	return obs
}

// snapshotSameNameAtOnce takes one snapshot, starts a sandbox from it,
// then takes eight more under its name at once.
func snapshotSameNameAtOnce(h Harness) func(ctx context.Context, t *testing.T, v vm.VM) []observation {
	return func(ctx context.Context, t *testing.T, v vm.VM) []observation {
		name := "localhost/podvm-vmtest-race:" + randomWord()
		// Whatever fails, every image made is removed: the name's, then
		// each by ID (those left nameless). Cleanups run last first, so
		// this one runs after the sandbox's.
		var mu sync.Mutex
		var ids []string
		t.Cleanup(func() {
			removeSnapshot(t, v, name)
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				removeSnapshot(t, v, id)
			}
		})
		take := func() (*vm.Snapshot, error) {
			snap, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: name})
			if err == nil {
				mu.Lock()
				ids = append(ids, snap.ID)
				mu.Unlock()
			}
			return snap, err
		}
		first, err := take()
		if err != nil {
			skipIfNotSupported(t, err)
			t.Fatalf("TakeSnapshot: %v", err)
		}
		w := fromSnapshot(ctx, t, h, first, vm.Config{})

		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = take()
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("snapshot %d of %d at once: %v", i+1, n, err)
			}
		}
		var obs []observation
		res, err, o := run(ctx, w, "sandbox of the first", exec.Command{Name: "echo", Args: []string{"runs on"}})
		want(t, res, err, "runs on\n", "", 0)
		obs = append(obs, o)
		err = vm.RemoveSnapshot(ctx, v, first.ID)
		obs = append(obs, observeSnapshot("the first, in use", err))
		wantErr(t, "removing the first snapshot, which lost its name but a sandbox uses", err, vm.ErrSnapshotInUse)
		if err := w.Remove(ctx); err != nil {
			t.Fatal(err)
		}
		err = vm.RemoveSnapshot(ctx, v, name)
		obs = append(obs, observeSnapshot("the name", err))
		if err != nil {
			t.Errorf("removing %s: %v", name, err)
		}
		mu.Lock()
		left := 0
		for _, id := range ids {
			err := vm.RemoveSnapshot(ctx, v, id)
			if !errors.Is(err, vm.ErrImageNotFound) {
				left++
				t.Errorf("snapshot %.12s is left once its sandbox and its name were removed (removing it: %v)", id, err)
			}
		}
		mu.Unlock()
		return append(obs, observation{Label: fmt.Sprintf("%d images left of %d", left, n+1)})
	}
}
