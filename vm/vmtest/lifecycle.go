package vmtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// lifecycleCases check Create and Remove against Podman's own view: what
// a failed or cancelled Create leaves, a container removed behind the
// VM's back, the config as the container has it, an unreachable Podman.
func lifecycleCases(h Harness) []testCase {
	return []testCase{
		{Name: "lifecycle/removed-behind-its-back", Promise: "a container removed behind the VM's back is ErrNoSuchContainer; Remove still succeeds",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				if err := h.RemoveContainer(ctx, v.ID()); err != nil {
					t.Fatalf("removing the container behind the VM's back: %v", err)
				}
				res, err, o := run(ctx, v, "run", exec.Command{Name: "true"})
				if !errors.Is(err, vm.ErrNoSuchContainer) || res != nil {
					t.Errorf("Run: got %+v, %v; want ErrNoSuchContainer", res, err)
				}
				for name, err := range map[string]error{
					"CopyIn":  v.CopyIn(ctx, "/tmp", strings.NewReader("")),
					"CopyOut": v.CopyOut(ctx, "/tmp", new(strings.Builder)),
				} {
					if !errors.Is(err, vm.ErrNoSuchContainer) {
						t.Errorf("%s: %v; want ErrNoSuchContainer", name, err)
					}
				}
				if err := v.Remove(ctx); err != nil {
					t.Errorf("Remove: %v; a container already gone counts as removed", err)
				}
				return []observation{o}
			}},
		{Name: "lifecycle/create-cancelled", Promise: "a Create cancelled at any point leaves no container behind, and Remove after it succeeds",
			Uncreated: true, Deadline: 3 * time.Minute,
			Test: func(ctx context.Context, t *testing.T, _ vm.VM) []observation {
				label, labels := testLabel()
				for _, after := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond} {
					v, err := h.NewVM(t, vm.Config{Labels: labels})
					if err != nil {
						t.Fatal(err)
					}
					cctx, cancel := context.WithTimeout(ctx, after)
					err = v.Create(cctx)
					cancel()
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("cancelled after %v: %v; want context.DeadlineExceeded", after, err)
					}
					if err == nil {
						if err := v.Remove(ctx); err != nil {
							t.Errorf("Remove: %v", err)
						}
						continue
					}
					if left := containers(ctx, t, h, label); len(left) > 0 {
						t.Errorf("cancelled after %v: containers left: %v", after, left)
					}
					if err := v.Remove(ctx); err != nil {
						t.Errorf("Remove after a cancelled Create: %v", err)
					}
				}
				if left := containers(ctx, t, h, label); len(left) > 0 {
					t.Errorf("containers left: %v", left)
				}
				return nil
			}},
		{Name: "lifecycle/create-failures", Promise: "Create fails with the sentinel that says why, removes what it made, and Remove after it succeeds",
			Config: func(c *vm.Config) { c.Name = "podvm-taken-" + randomWord() },
			Test: func(ctx context.Context, t *testing.T, first vm.VM) []observation {
				name := strings.TrimPrefix(containerName(ctx, t, h, first), "/")
				label, labels := testLabel()
				var obs []observation
				for _, c := range []struct {
					label string
					cfg   vm.Config
					want  error
				}{
					{"name in use", vm.Config{Name: name}, vm.ErrNameInUse},
					{"never pull a missing image", vm.Config{Image: "localhost/podvm-no-such-image:latest", Pull: vm.PullNever}, vm.ErrImageNotFound},
					{"no registry has it", vm.Config{Image: "localhost/podvm-no-such-image:latest"}, vm.ErrImageNotFound},
				} {
					c.cfg.Labels = labels
					v, err := h.NewVM(t, c.cfg)
					if err != nil {
						t.Fatal(err)
					}
					err = v.Create(ctx)
					if !errors.Is(err, c.want) {
						t.Errorf("%s: %v; want %v", c.label, err, c.want)
					}
					if !errors.Is(v.Create(ctx), vm.ErrAlreadyCreated) {
						t.Errorf("%s: a second Create is not ErrAlreadyCreated", c.label)
					}
					if err := v.Remove(ctx); err != nil {
						t.Errorf("%s: Remove: %v", c.label, err)
					}
					obs = append(obs, observe(c.label, nil, err))
				}
				if left := containers(ctx, t, h, label); len(left) > 0 {
					t.Errorf("failed creates left containers: %v", left)
				}
				return obs
			}},
		{Name: "lifecycle/config", Promise: "every field of the Config reaches the container",
			Config: func(c *vm.Config) {
				_, c.Labels = testLabel()
				c.Labels["team"] = "build"
				c.Name = "podvm-config-" + randomWord()
				c.Workdir = "/tmp"
				c.Env = []string{"GREETING=hello", "EMPTY="}
				c.User = "65534:65534"
				c.Memory = 64 << 20
				c.Pids = 99
				c.ReadOnlyRootfs = true
			},
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				c := containerOf(ctx, t, h, v)
				if !strings.HasPrefix(strings.TrimPrefix(c.Name, "/"), "podvm-config-") || c.Labels["team"] != "build" || c.Labels[vm.LabelManaged] != "true" {
					t.Errorf("name %q, labels %v: the config's and podvm's own are missing", c.Name, c.Labels)
				}
				res, err, o := run(ctx, v, "inside", sh(`pwd; id -u; id -g; echo "$GREETING/$EMPTY"
cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max
cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes
touch /etc/x 2>/dev/null && echo etc-writable; touch /tmp/x && echo tmp-writable`))
				want(t, res, err, fmt.Sprintf("/tmp\n65534\n65534\nhello/\n99\n%d\ntmp-writable\n", 64<<20), "", 0)
				return []observation{o}
			}},
		{Name: "lifecycle/unavailable", Promise: "a Podman that cannot be reached is ErrUnavailable, never a hang, and Remove after it succeeds",
			Uncreated: true,
			Test: func(ctx context.Context, t *testing.T, _ vm.VM) []observation {
				v, err := h.NewUnreachableVM(t, vm.Config{})
				if err == nil {
					err = v.Create(ctx)
					if rmErr := v.Remove(ctx); rmErr != nil {
						t.Errorf("Remove: %v", rmErr)
					}
				}
				skipIfNotSupported(t, err)
				if !errors.Is(err, vm.ErrUnavailable) || errors.Is(err, exec.ErrNotFound) {
					t.Errorf("got %v; want ErrUnavailable (and not a command missing in the sandbox)", err)
				}
				return []observation{observe("create", nil, err)}
			}},
	}
}

// testLabel returns a label unique to one case, as "key=value" and as a
// map for Config.Labels.
func testLabel() (string, map[string]string) {
	v := randomWord()
	return "io.podvm.test=" + v, map[string]string{"io.podvm.test": v}
}

// containers lists what carries label, failing t when Podman cannot say.
func containers(ctx context.Context, t *testing.T, h Harness, label string) []Container {
	t.Helper()
	cs, err := h.Containers(ctx, label)
	if err != nil {
		t.Fatalf("listing containers: %v", err)
	}
	return cs
}

// containerOf returns v's container as Podman lists it.
func containerOf(ctx context.Context, t *testing.T, h Harness, v vm.VM) Container {
	t.Helper()
	for _, c := range containers(ctx, t, h, vm.LabelManaged+"=true") {
		if c.ID == v.ID() {
			return c
		}
	}
	t.Fatalf("container %s is not listed", v.ID())
	return Container{}
}

func containerName(ctx context.Context, t *testing.T, h Harness, v vm.VM) string {
	return containerOf(ctx, t, h, v).Name
}

// randomWord is a fresh lowercase hex word, for names and labels.
func randomWord() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
