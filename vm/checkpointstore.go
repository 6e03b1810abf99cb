package vm

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file is where checkpoints live: on the caller's machine, in a
// directory of the caller's alone, as an archive (<ID>.tar, Podman's
// export) and its metadata (<ID>.json), written last: the commit point.

// Labels of a checkpoint, in its metadata, besides [LabelOwner],
// [LabelOwnerPID], [LabelOwnerHost] and [LabelCreated] (who took it,
// when: [Reap] with [WithCheckpoints] judges them as a sandbox's); and
// of a sandbox [Restore] made.
const (
	LabelCheckpoint       = "io.podvm.checkpoint"        // "true" on every checkpoint
	LabelCheckpointSource = "io.podvm.checkpoint.source" // the container ID of the sandbox it was taken from
	LabelRestoredFrom     = "io.podvm.restored-from"     // on a sandbox Restore made: the checkpoint's ID
)

var (
	// ErrCheckpointNotFound: no checkpoint has that ID or path, or its
	// files are gone.
	ErrCheckpointNotFound = errors.New("vm: checkpoint not found")
	// ErrInvalidCheckpoint: a checkpoint that is not podvm's, is damaged,
	// or was written by another version of podvm.
	ErrInvalidCheckpoint = errors.New("vm: invalid checkpoint")
)

// Checkpoint is a running sandbox's processes, their memory and its
// filesystem, saved by [TakeCheckpoint] as files of the caller's. It
// holds what the sandbox held: the memory of every process (every secret
// a Run passed in its environment, every key loaded, the agent's own
// memory), its layer, /dev/shm and tmpfs mounts, and its Config, Env
// included. It does not hold its bind mounts: a copy mounts the same
// host directories, shared. Keep checkpoints as you keep the secrets
// they may hold; remove them with [RemoveCheckpoint].
//
// Its fields describe it; changing them changes nothing: [Restore]
// restores what its metadata says, from its Path.
type Checkpoint struct {
	ID      string            // 24 hex digits
	Path    string            // the archive: <dir>/<ID>.tar, an uncompressed tar as Podman exports it
	Source  string            // the container ID of the sandbox it was taken from
	Image   string            // the sandbox's image, which every restore needs present
	Created time.Time         // when it was taken
	Size    int64             // the archive's size in bytes
	Labels  map[string]string // podvm's (above) and the caller's

	meta    checkpointMeta
	archive string // Path as read: what Restore restores
}

// checkpointMeta is a checkpoint's <ID>.json.
type checkpointMeta struct {
	Version int               `json:"version"`
	ID      string            `json:"id"`
	Labels  map[string]string `json:"labels"`
	Source  string            `json:"source"`
	Service string            `json:"service"`
	Image   string            `json:"image"`
	Created time.Time         `json:"created"`
	Size    int64             `json:"size"`
	// Config is the source's, with its defaults; Restore makes its
	// copies with it, their Name and Labels their own.
	Config Config `json:"config"`
	// Agent is the agent's digest ("" for Config.PodmanExec), for its
	// architecture Arch (the service's): a copy runs that agent, which
	// only this podvm's client speaks to.
	Agent string `json:"agent,omitempty"`
	Arch  string `json:"arch,omitempty"`
	// NextRun is the original client's next run id: a copy's client
	// begins there.
	NextRun   uint32       `json:"next_run,omitempty"`
	Processes []heldRecord `json:"processes,omitempty"`
}

// heldRecord is a process the source held by handle at the checkpoint,
// for a copy to adopt.
type heldRecord struct {
	Run       uint32    `json:"run"`
	PID       int       `json:"pid"`
	Name      string    `json:"name,omitempty"`
	Args      []string  `json:"args"`
	Dir       string    `json:"dir,omitempty"`
	TTY       bool      `json:"tty,omitempty"`
	MaxOutput int       `json:"max_output,omitempty"`
	Start     time.Time `json:"start"`
}

const checkpointMetaVersion = 1

var checkpointIDRE = regexp.MustCompile(`^[0-9a-f]{24}$`)

// DefaultCheckpointDir is where checkpoints are written unless
// [CheckpointOptions.Dir] says otherwise, and looked for unless
// [WithCheckpointDir] does: $XDG_STATE_HOME/podvm/checkpoints, else
// ~/.local/state/podvm/checkpoints.
func DefaultCheckpointDir() (string, error) {
	if s := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(s) {
		return filepath.Join(s, "podvm", "checkpoints"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("vm: checkpoints: no directory for them: %w", err)
	}
	return filepath.Join(home, ".local", "state", "podvm", "checkpoints"), nil
}

// WithCheckpointDir makes [OpenCheckpoint], [ListCheckpoints],
// [RemoveCheckpoint] and [Reap] look for checkpoints in dir instead of
// [DefaultCheckpointDir].
func WithCheckpointDir(dir string) Option { return func(o *options) { o.checkpointDir = dir } }

// WithCheckpoints makes [Reap] remove the checkpoints whose owner is
// gone too (judged as a sandbox's, by the labels it was taken with; not
// by age: Reap's olderThan is for sandboxes alone), archives left
// without their metadata for 10 minutes,
// and the files that checkpoints and restores of dead processes left
// half-written, in [DefaultCheckpointDir] or [WithCheckpointDir]'s. It
// does so even when no Podman service answers. Their IDs come first in
// Reap's list.
func WithCheckpoints() Option { return func(o *options) { o.checkpoints = true } }

// checkpointDir returns dir ("" the default) made absolute, after
// checking that it is one for checkpoints: not in the system's
// temporary directory, where they would outlive their use unseen.
func checkpointDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if dir == "" {
		abs, err = DefaultCheckpointDir()
	}
	if err != nil {
		return "", fmt.Errorf("%w: checkpoint directory %q: %w", ErrInvalidConfig, dir, err)
	}
	if err := notInTemp(abs); err != nil {
		return "", err
	}
	return abs, nil
}

// notInTemp refuses dir when it is in a temporary directory (the
// system's, /tmp or /var/tmp), by its name or, as far as it exists, by
// where its symbolic links lead.
func notInTemp(dir string) error {
	real := dir
	for d := dir; ; d = filepath.Dir(d) { // the longest part that exists, resolved
		if r, err := filepath.EvalSymlinks(d); err == nil {
			rest, _ := filepath.Rel(d, dir)
			real = filepath.Join(r, rest)
			break
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	for _, tmp := range []string{os.TempDir(), "/tmp", "/var/tmp"} {
		for _, t := range []string{tmp, resolved(tmp)} {
			for _, p := range []string{dir, real} {
				if rel, err := filepath.Rel(t, p); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
					return fmt.Errorf("%w: checkpoint directory %s is in the temporary directory %s: checkpoints hold the sandbox's memory, secrets included, and are never left there", ErrInvalidConfig, dir, t)
				}
			}
		}
	}
	return nil
}

// resolved is path with its symbolic links followed, or path.
func resolved(path string) string {
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	return path
}

// openCheckpointDir makes dir if need be (mode 0700, its parents 0700
// too) and checks it (checkCheckpointDir).
func openCheckpointDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("vm: checkpoints: %w", err)
	}
	return checkCheckpointDir(dir)
}

// checkCheckpointDir checks that dir is a directory of the caller's
// alone (mode 0700, not a symbolic link) out of any temporary directory.
func checkCheckpointDir(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("vm: checkpoints: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("vm: checkpoints: %w", err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 || !ownedByCaller(fi) {
		return fmt.Errorf("%w: checkpoint directory %s is not a directory of the caller's with mode 0700 (nor a symbolic link)", ErrInvalidConfig, dir)
	}
	return notInTemp(dir)
}

// writeMeta commits checkpoint m in dir: its metadata, written whole
// under a temporary name, then renamed.
func writeMeta(dir string, m checkpointMeta) error {
	b, err := json.MarshalIndent(m, "", "\t")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, spoolName(m.ID, "json"))
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, m.ID+".json")); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// readCheckpoint reads the checkpoint whose metadata is at path.
func readCheckpoint(path string) (*Checkpoint, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrCheckpointNotFound, path)
	}
	if err != nil {
		return nil, fmt.Errorf("vm: checkpoint %s: %w", path, err)
	}
	var m checkpointMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidCheckpoint, path, err)
	}
	switch {
	case m.Version != checkpointMetaVersion:
		return nil, fmt.Errorf("%w: %s: metadata version %d (this podvm reads %d)", ErrInvalidCheckpoint, path, m.Version, checkpointMetaVersion)
	case m.Labels[LabelCheckpoint] != "true":
		return nil, fmt.Errorf("%w: %s: not podvm's (no %s label)", ErrInvalidCheckpoint, path, LabelCheckpoint)
	case !checkpointIDRE.MatchString(m.ID) || filepath.Base(path) != m.ID+".json":
		return nil, fmt.Errorf("%w: %s: its ID is %q", ErrInvalidCheckpoint, path, m.ID)
	}
	return m.checkpoint(filepath.Dir(path)), nil
}

// checkpoint is the Checkpoint m describes, in dir.
func (m checkpointMeta) checkpoint(dir string) *Checkpoint {
	archive := filepath.Join(dir, m.ID+".tar")
	return &Checkpoint{ID: m.ID, Path: archive, Source: m.Source, Image: m.Image,
		Created: m.Created, Size: m.Size, Labels: maps.Clone(m.Labels), meta: m, archive: archive}
}

// OpenCheckpoint returns the checkpoint ref names: its ID, in
// [DefaultCheckpointDir] or [WithCheckpointDir]'s, or the path of its
// archive or metadata. For a checkpoint another process took. It fails
// with [ErrCheckpointNotFound] when it is not there (its archive
// included), [ErrInvalidCheckpoint] when it is not podvm's.
func OpenCheckpoint(ref string, opts ...Option) (*Checkpoint, error) {
	path, err := checkpointRef(ref, newOptions(opts))
	if err != nil {
		return nil, err
	}
	cp, err := readCheckpoint(path)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(cp.Path); err != nil {
		return nil, fmt.Errorf("%w: %s: its archive: %w", ErrCheckpointNotFound, ref, err)
	}
	return cp, nil
}

// checkpointRef is the metadata file ref names (see OpenCheckpoint).
func checkpointRef(ref string, o options) (string, error) {
	if checkpointIDRE.MatchString(ref) {
		dir, err := checkpointDir(o.checkpointDir)
		if err != nil {
			return "", err
		}
		return filepath.Join(dir, ref+".json"), nil
	}
	base := filepath.Base(ref)
	id, ok := strings.CutSuffix(base, ".json")
	if !ok {
		id, ok = strings.CutSuffix(base, ".tar")
	}
	if !ok || !checkpointIDRE.MatchString(id) {
		return "", fmt.Errorf("%w: %q is neither a checkpoint's ID (24 hex digits) nor the path of its .tar or .json", ErrInvalidCheckpoint, ref)
	}
	return filepath.Join(filepath.Dir(ref), id+".json"), nil
}

// ListCheckpoints returns the checkpoints in [DefaultCheckpointDir] or
// [WithCheckpointDir]'s, oldest first, of those that carry every label
// of [WithLabel]. A directory that does not exist holds none. Files that
// are not checkpoints are passed over; a checkpoint whose archive is
// gone is listed (RemoveCheckpoint removes what is left of it).
func ListCheckpoints(ctx context.Context, opts ...Option) ([]Checkpoint, error) {
	o := newOptions(opts)
	dir, err := checkpointDir(o.checkpointDir)
	if err != nil {
		return nil, err
	}
	all, err := listCheckpoints(dir)
	if err != nil {
		return nil, err
	}
	var list []Checkpoint
	for _, cp := range all {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if hasLabels(cp.Labels, o.labels) {
			list = append(list, cp)
		}
	}
	return list, nil
}

func listCheckpoints(dir string) ([]Checkpoint, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vm: checkpoints: %w", err)
	}
	var list []Checkpoint
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !checkpointIDRE.MatchString(id) {
			continue
		}
		cp, err := readCheckpoint(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // not podvm's, or gone since
		}
		list = append(list, *cp)
	}
	slices.SortFunc(list, func(a, b Checkpoint) int { return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID)) })
	return list, nil
}

// RemoveCheckpoint removes the checkpoint ref names (see
// [OpenCheckpoint]): its metadata first, so that it is listed no more,
// then its archive (or the archive alone, whose metadata is gone).
// Copies restored from it are sandboxes of their own, untouched. It
// fails with [ErrCheckpointNotFound] when neither file is there, and
// [ErrInvalidCheckpoint] for one that is not podvm's.
func RemoveCheckpoint(ctx context.Context, ref string, opts ...Option) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	path, err := checkpointRef(ref, newOptions(opts))
	if err != nil {
		return err
	}
	cp, err := readCheckpoint(path)
	if errors.Is(err, ErrCheckpointNotFound) {
		// An archive whose metadata never was written, or went first:
		// in a checkpoint directory, and a checkpoint archive whole.
		archive := strings.TrimSuffix(path, ".json") + ".tar"
		if _, serr := os.Lstat(archive); serr == nil {
			if err := orphanArchive(archive); err != nil {
				return err
			}
			return os.Remove(archive)
		}
	}
	if err != nil {
		return err
	}
	return removeCheckpoint(cp.Path, path)
}

// orphanArchive checks that archive, without its metadata, is a
// checkpoint's archive in a checkpoint directory, before it is removed.
func orphanArchive(archive string) error {
	if err := checkCheckpointDir(filepath.Dir(archive)); err != nil {
		return err
	}
	fi, err := os.Lstat(archive)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a file", ErrInvalidCheckpoint, archive)
	}
	if _, _, err := inspectArchive(archive); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalidCheckpoint, archive, err)
	}
	return nil
}

// removeCheckpoint removes a checkpoint's metadata, then its archive.
func removeCheckpoint(archive, meta string) error {
	if err := os.Remove(meta); err != nil {
		return fmt.Errorf("vm: removing checkpoint: %w", err)
	}
	if err := os.Remove(archive); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("vm: removing checkpoint: %w", err)
	}
	return nil
}

// reapCheckpoints removes the checkpoints in o's directory whose owner
// chk judges gone, and the half-written files (.PID-….partial,
// .restore, .json) of dead processes.
func reapCheckpoints(ctx context.Context, o options, chk ownerCheck, removed []string, errs []error) ([]string, []error) {
	dir, err := checkpointDir(o.checkpointDir)
	if err != nil {
		return removed, append(errs, err)
	}
	list, err := listCheckpoints(dir)
	if err != nil {
		return removed, append(errs, err)
	}
	for _, cp := range list {
		if ctx.Err() != nil {
			return removed, append(errs, ctx.Err())
		}
		if !hasLabels(cp.Labels, o.labels) {
			continue
		}
		why := chk.gone(cp.Labels)
		if why == "" {
			continue
		}
		if err := removeCheckpoint(cp.Path, filepath.Join(dir, cp.ID+".json")); err != nil {
			errs = append(errs, err)
			continue
		}
		o.log.Info("podvm: reaped checkpoint", "id", cp.ID, "reason", why)
		removed = append(removed, cp.ID)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		name := e.Name()
		why := ""
		if spoolGone(name, chk) {
			why = "its writer is gone"
		} else if id, ok := strings.CutSuffix(name, ".tar"); ok && checkpointIDRE.MatchString(id) && !exists(filepath.Join(dir, id+".json")) {
			// Renamed in before its metadata was written, and never
			// was: a checkpoint whose writer died in between.
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > orphanArchiveAge && orphanArchive(filepath.Join(dir, name)) == nil {
				why = "an archive without its metadata"
			}
		}
		if why != "" && os.Remove(filepath.Join(dir, name)) == nil {
			o.log.Info("podvm: removed a checkpoint file", "file", name, "reason", why)
		}
	}
	return removed, errs
}

// orphanArchiveAge is how old an archive without its metadata must be
// for Reap to take it: a checkpoint is renamed in a moment before its
// metadata is written.
const orphanArchiveAge = 10 * time.Minute

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// spoolName is the name of a file that this process writes in a
// checkpoint directory on its way to another (kind: partial, restore,
// json): its owner (as LabelOwner names it, else its PID), its ID, its
// kind.
func spoolName(id, kind string) string {
	return "." + cmp.Or(self(), strconv.Itoa(os.Getpid())) + "-" + id + "." + kind
}

// spoolGone reports whether name is a spoolName whose owner chk judges
// gone.
func spoolGone(name string, chk ownerCheck) bool {
	rest, ok := strings.CutPrefix(name, ".")
	owner, rest, ok2 := strings.Cut(rest, "-")
	if !ok || !ok2 || !(strings.HasSuffix(rest, ".partial") || strings.HasSuffix(rest, ".restore") || strings.HasSuffix(rest, ".json")) {
		return false
	}
	if _, ok := parseOwner(owner); ok {
		return chk.gone(map[string]string{LabelOwner: owner}) != ""
	}
	pid, err := strconv.Atoi(owner)
	return err == nil && pid > 0 && !chk.alive(pid)
}
