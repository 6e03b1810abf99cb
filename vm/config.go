package vm

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/driver"
)

// Labels every podvm sandbox carries, so that [Reap] and
// `podman ps --filter label=io.podvm.managed` find them; [Reap] says how
// it judges their owner. Snapshots carry the owner's too.
const (
	LabelManaged = "io.podvm.managed" // "true"
	// LabelOwner names the creating process wherever it ran:
	// SPACE.PID.START. SPACE is 16 hex digits, the start of the sha256 of
	// the boot ID (/proc/sys/kernel/random/boot_id) and the process's PID
	// and time namespaces (as /proc/self/ns/pid and /proc/self/ns/time
	// name them): two machines, two boots, or two containers of one
	// machine with PID namespaces of their own, have different SPACEs.
	// PID is its pid there; START its start time, in clock ticks since
	// boot (field 22 of /proc/PID/stat), which a process that reuses the
	// PID does not share. A process that /proc cannot name (not Linux,
	// /proc unreadable, or of another PID namespace) sets it empty.
	LabelOwner     = "io.podvm.owner"
	LabelOwnerPID  = "io.podvm.owner.pid"  // pid of the creating process; see LabelOwner
	LabelOwnerHost = "io.podvm.owner.host" // hostname of the creating process; see LabelOwner
	LabelCreated   = "io.podvm.created"    // creation time, Unix seconds
)

// Defaults applied to a zero [Config] field.
const (
	DefaultNetwork = "none"
	DefaultPids    = driver.DefaultPids
)

// NoPidsLimit as [Config.Pids] asks for no pids limit: a fork bomb in the
// sandbox is then held by nothing but the host's own limits. It is the
// one way to run on rootless Podman without the pids cgroup controller
// (cgroup v1, or v2 without delegation), which refuses any pids limit
// rather than ignore it.
const NoPidsLimit = -1

// DefaultCapabilities are the only Linux capabilities a sandbox keeps; all
// others are dropped. They let root in the sandbox manage the files it owns
// and its own processes (chown, writing files of other users, setuid to an
// unprivileged user, signalling): what compilers, package scripts and test
// runners need. Dropped, among others: NET_RAW (raw sockets),
// NET_BIND_SERVICE, SYS_CHROOT, MKNOD (device nodes), AUDIT_WRITE, SETFCAP
// and SETPCAP (granting capabilities to files or processes).
var DefaultCapabilities = []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"}

// PullPolicy says when Create fetches the image.
type PullPolicy string

// Pull policies. The zero value is PullMissing.
const (
	PullMissing PullPolicy = driver.PullMissing // pull only when not present
	PullNever   PullPolicy = driver.PullNever   // fail with ErrImageNotFound when not present
	PullAlways  PullPolicy = driver.PullAlways  // pull before every Create
)

// Mount makes a host directory or file visible in the sandbox.
type Mount struct {
	// Source is an absolute path on the Podman host. It must exist.
	Source string
	// Target is an absolute path in the sandbox, not "/".
	Target string
	// ReadOnly mounts it read-only.
	ReadOnly bool
}

// Config describes a sandbox. Only Image is required; every zero field has
// a safe default, documented on it.
//
// On Podman a Config becomes one container. [CLIVM] makes it with these
// flags of `podman run -d` (of `podman create`, when the agent is PID 1),
// and [APIVM] sends the same settings to the service as a spec:
//
//   - Image: the image, with --pull never: Create has already made it
//     present as Pull says, from a registry or from ImageArchive.
//   - Name: --name. Labels: --label, with podvm's own ([ManagedLabels]).
//   - Network: --network, "none" unless set.
//   - Memory: --memory and --memory-swap, the same value: swap included.
//   - CPUs: --cpus.
//   - Pids: --pids-limit, [DefaultPids] unless set ([NoPidsLimit]: -1).
//   - ReadOnlyRootfs: --read-only --read-only-tmpfs.
//   - Mounts: -v source:target, with :ro when ReadOnly. Workdir:
//     --workdir. User: --user. Env: --env, one per entry.
//   - Always: --security-opt no-new-privileges, --cap-drop all and
//     --cap-add [DefaultCapabilities], --http-proxy=false (the host's proxy
//     variables stay out), and as entrypoint podvm's agent at /.podvm
//     or, with PodmanExec, Podman's init (--init, catatonit) in pause mode.
//
// On Kubernetes a Config becomes a Pod instead: see package
// github.com/podvm/podvm/vm/kube.
type Config struct {
	// Image is the image reference, e.g. "localhost/podvm-test:latest".
	Image string
	// Name is the container name. If empty, Podman generates one.
	Name string
	// Mounts are bind mounts. Mounting a working directory is one entry:
	// Mount{Source: dir, Target: "/work"} (with Workdir "/work"). /.podvm
	// and what is under it hold podvm's agent: no Target may be there,
	// unless PodmanExec is set.
	Mounts []Mount
	// Workdir is the default working directory of commands. If empty, the
	// image's.
	Workdir string
	// Env holds KEY=VALUE entries set for every command, on top of the
	// image's environment. The host's environment never enters the sandbox.
	Env []string
	// User runs commands as "user", "uid" or "uid:gid". If empty, the
	// image's user.
	User string
	// Network is "none" (the default: loopback only), or a Podman network
	// mode or name such as "bridge", "slirp4netns" or "host".
	Network string
	// Memory limits the sandbox's memory in bytes (swap included); zero
	// means no limit. Podman requires at least 6 MiB.
	Memory int64
	// CPUs limits CPU time, in CPUs (1.5 = one and a half); zero means no
	// limit.
	CPUs float64
	// Pids limits the number of processes (threads included); zero means
	// DefaultPids, [NoPidsLimit] none. podvm's agent counts too: PID 1
	// holds 14 pids and each of its per-run shims 8 (threads they make at
	// start, so that a full limit cannot kill them; one more at times),
	// with a shim per Run in flight, one spare, and after a burst of
	// concurrent Runs as many idle ones (up to 32, until unused for 30 s).
	// An idle sandbox holds 22, one running a command 30 besides the
	// command's own processes: a limit below 32 leaves commands little or
	// no room (below 23, none), and each concurrent Run takes 8 more.
	// With PodmanExec there is no agent: PID 1 is Podman's init.
	Pids int64
	// ReadOnlyRootfs mounts the image read-only, with writable tmpfs
	// mounts on /tmp, /var/tmp and /run.
	ReadOnlyRootfs bool
	// Labels are added to podvm's own labels (which cannot be overridden).
	Labels map[string]string
	// Pull is the image pull policy; empty means PullMissing.
	Pull PullPolicy
	// ImageArchive, if set, is an image archive on the caller's machine
	// (as `podman save` writes it) that holds Image. Create loads it
	// instead of pulling from a registry: when Image is missing, or every
	// time with PullAlways. PullNever forbids registries, not the archive.
	// It works with remote services too: the archive is uploaded.
	ImageArchive string
	// PodmanExec runs each command as a Podman exec session instead of
	// through podvm's agent, the sandbox's PID 1 by default. That path is
	// ~100× slower per Run, cannot carry bytes that are not UTF-8, reports
	// no usage, and its timeout kill (a marker in the environment, process
	// groups) misses a process that cleared its environment once no
	// process it can find is left in its group (`setsid env -i …`, or
	// `env -i …` whose parent exited). It is there for an image whose
	// architecture the agent does not cover (the module carries it for
	// amd64 and arm64).
	PodmanExec bool
	// Checkpointable makes the agent talk over the container's stdio,
	// attached through Podman, even where a unix socket of the caller's
	// would reach it (a Podman service on this machine, by default): a
	// checkpoint ([TakeCheckpoint], [Suspend]) can carry the stdio, and
	// not a connection to a process outside the sandbox. Streams through
	// the stdio are slower (about a third of the socket's throughput,
	// on this project's machine). Elsewhere it changes nothing.
	Checkpointable bool
}

var (
	// An image reference: name[:tag][@digest], no leading '-', no blanks
	// or shell metacharacters.
	imageRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._/:@+-]*$`)
	nameRE  = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
	userRE  = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9_.-]*(:[a-zA-Z0-9_][a-zA-Z0-9_.-]*)?$`)
	netRE   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.:-]*$`)
)

// Upper bounds beyond which a limit is certainly a mistake.
const (
	minMemory = 6 << 20
	maxCPUs   = 4096
	maxPids   = 1 << 22
)

// Validate reports whether c is usable, with an error matching
// [ErrInvalidConfig] naming the offending field. It checks form only; that
// mount sources exist is checked by the backends when the Podman host is
// this machine.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	switch {
	case c.Image == "":
		return bad("empty image")
	case !imageRE.MatchString(c.Image) || len(c.Image) > 512:
		return bad("image %q is not an image reference", c.Image)
	case c.Name != "" && (!nameRE.MatchString(c.Name) || len(c.Name) > 253):
		return bad("name %q: want letters, digits, '_', '.', '-'", c.Name)
	case c.Workdir != "" && (!path.IsAbs(c.Workdir) || strings.IndexByte(c.Workdir, 0) >= 0):
		return bad("workdir %q is not an absolute path", c.Workdir)
	case c.User != "" && !userRE.MatchString(c.User):
		return bad("user %q: want user, uid or uid:gid", c.User)
	case c.Network != "" && !netRE.MatchString(c.Network):
		return bad("network %q is not a network mode or name", c.Network)
	case c.Memory < 0 || (c.Memory > 0 && c.Memory < minMemory):
		return bad("memory %d bytes: want 0 (no limit) or at least %d", c.Memory, minMemory)
	case c.CPUs < 0 || c.CPUs > maxCPUs || c.CPUs != c.CPUs:
		return bad("cpus %v: want 0 (no limit) up to %d", c.CPUs, maxCPUs)
	case c.Pids < NoPidsLimit || c.Pids > maxPids:
		return bad("pids %d: want 0 (default %d) up to %d, or NoPidsLimit (-1)", c.Pids, DefaultPids, maxPids)
	case strings.IndexByte(c.ImageArchive, 0) >= 0:
		return bad("NUL byte in image archive path %q", c.ImageArchive)
	case !slices.Contains([]PullPolicy{"", PullMissing, PullNever, PullAlways}, c.Pull):
		return bad("pull policy %q: want %q, %q or %q", c.Pull, PullMissing, PullNever, PullAlways)
	}
	if err := exec.ValidateEnv(c.Env); err != nil {
		return bad("env: %v", err)
	}
	for _, m := range c.Mounts {
		if err := m.validate(); err != nil {
			return bad("%v", err)
		}
		if t := path.Clean(m.Target); !c.PodmanExec && (t == agent.Dir || strings.HasPrefix(t, agent.Dir+"/")) {
			return bad("mount target %q: %s holds podvm's agent, the sandbox's PID 1", m.Target, agent.Dir)
		}
	}
	for k, v := range c.Labels {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return bad("label %q=%q", k, v)
		}
	}
	return nil
}

func (m Mount) validate() error {
	switch {
	case !path.IsAbs(m.Source):
		return fmt.Errorf("mount source %q is not an absolute path", m.Source)
	case !path.IsAbs(m.Target):
		return fmt.Errorf("mount target %q is not an absolute path", m.Target)
	case path.Clean(m.Target) == "/":
		return fmt.Errorf("mount target %q would hide the whole sandbox", m.Target)
	case strings.ContainsAny(m.Source+m.Target, ",:\x00"):
		return fmt.Errorf("mount %q -> %q: ',', ':' and NUL are not allowed in paths", m.Source, m.Target)
	}
	return nil
}

// checkMountSources checks that every mount source exists on this machine;
// backends call it when the Podman host is local.
func (c Config) checkMountSources() error {
	for _, m := range c.Mounts {
		if _, err := os.Stat(m.Source); err != nil {
			return fmt.Errorf("%w: mount source %q: %w", ErrInvalidConfig, m.Source, err)
		}
	}
	return nil
}

// withDefaults returns c with its zero fields replaced by their defaults,
// but for Pids: a zero Pids is [DefaultPids] to the engine (where there is
// a per-sandbox limit to set), and it tells a limit asked for from none.
func (c Config) withDefaults() Config {
	c.Network, c.Pull = cmp.Or(c.Network, DefaultNetwork), cmp.Or(c.Pull, PullMissing)
	return c
}

// spec is c, with defaults, as every engine's driver takes it: the one
// mapping of a Config, with podvm's labels. Its PID 1 is the engine's
// init until an agent is put in ([agentMount.spec]).
func (c Config) spec() driver.Spec {
	s := driver.Spec{Name: c.Name, Image: c.Image, Pull: string(c.Pull), ImageArchive: c.ImageArchive,
		Labels: c.labels(), Env: c.Env, Workdir: c.Workdir, User: c.User,
		Network: c.Network, Memory: c.Memory, CPUs: c.CPUs, Pids: c.Pids, ReadOnlyRootfs: c.ReadOnlyRootfs,
		Capabilities: DefaultCapabilities}
	for _, m := range c.Mounts {
		s.Mounts = append(s.Mounts, driver.Mount(m))
	}
	return s
}

// spec returns a copy of s, a sandbox's spec, with the agent a as its
// PID 1, mounted or not; with no agent (the Podman exec path), s as it is.
func (a *agentMount) spec(s driver.Spec) driver.Spec {
	s.Labels = maps.Clone(s.Labels)
	s.Mounts = slices.Clone(s.Mounts)
	if a == nil {
		return s
	}
	s.Agent = agent.Path
	if a.hostDir != "" {
		s.Mounts = append(s.Mounts, driver.Mount{Source: a.hostDir, Target: agent.Dir, ReadOnly: true})
	}
	if a.chanDir != "" {
		s.Mounts = append(s.Mounts, driver.Mount{Source: a.chanDir, Target: agent.ChannelDir, ReadOnly: true})
		s.AgentArgs = agent.ConnectArgs
	}
	return s
}

// labels returns the user's labels plus podvm's own.
func (c Config) labels() map[string]string { return ManagedLabels(c.Labels) }

// ManagedLabels returns a copy of extra plus the labels vm puts on every
// sandbox it makes: [LabelManaged], [LabelOwner], [LabelOwnerPID],
// [LabelOwnerHost] and [LabelCreated], naming this process as the owner
// and now as the time. A container or pod made beside podvm by other
// means (a benchmark's `podman run` or `kubectl run`) that carries them
// is [Reap]'s to remove once this process is gone, as a sandbox is.
// podvm's labels win over extra's.
func ManagedLabels(extra map[string]string) map[string]string {
	l := maps.Clone(extra)
	if l == nil {
		l = map[string]string{}
	}
	l[LabelManaged] = "true"
	setOwner(l)
	l[LabelCreated] = strconv.FormatInt(time.Now().Unix(), 10)
	return l
}
