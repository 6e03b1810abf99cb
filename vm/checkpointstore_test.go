package vm

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// storeDir is a checkpoint directory for a test, out of the temporary
// directory, removed when it ends.
func storeDir(t *testing.T) string {
	t.Helper()
	base, err := DefaultCheckpointDir()
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(base, 0o700))
	dir, err := os.MkdirTemp(base, "unit-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fakeCheckpoint writes a checkpoint's two files to dir, as
// TakeCheckpoint would, with labels on top of podvm's, and returns its
// ID.
func fakeCheckpoint(t *testing.T, dir string, created time.Time, labels map[string]string) string {
	t.Helper()
	m := checkpointMeta{Version: checkpointMetaVersion, ID: randomHex(), Labels: map[string]string{LabelCheckpoint: "true"}, Created: created, Image: "img", Config: Config{Image: "img"}}
	setOwner(m.Labels)
	for k, v := range labels {
		m.Labels[k] = v
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, m.ID+".tar"), []byte("archive"), 0o600))
	require.NoError(t, writeMeta(dir, m))
	return m.ID
}

func TestCheckpointDirRefusals(t *testing.T) {
	t.Parallel()
	_, err := checkpointDir(filepath.Join(os.TempDir(), "ckpt"))
	require.ErrorIs(t, err, ErrInvalidConfig, "never in the temporary directory")
	_, err = checkpointDir(os.TempDir())
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = checkpointDir("/var/tmp/ckpt")
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = TakeCheckpoint(context.Background(), new(APIVM), CheckpointOptions{Dir: os.TempDir()})
	require.ErrorIs(t, err, ErrInvalidConfig, "refused before anything else")

	dir := storeDir(t)
	open := filepath.Join(dir, "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	require.ErrorIs(t, openCheckpointDir(open), ErrInvalidConfig, "others can read it")
	made := filepath.Join(dir, "a", "b")
	require.NoError(t, openCheckpointDir(made))
	fi, err := os.Stat(made)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())

	// A way into the temporary directory by a symbolic link.
	into := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(t.TempDir(), into))
	_, err = checkpointDir(filepath.Join(into, "ckpt"))
	require.ErrorIs(t, err, ErrInvalidConfig, "not by its name, but where it leads")
	require.ErrorIs(t, openCheckpointDir(into), ErrInvalidConfig, "a symbolic link")

	// Restore reads from the caller's own directory alone.
	cp, err := OpenCheckpoint(filepath.Join(open, fakeCheckpoint(t, open, time.Now(), nil)+".json"))
	require.NoError(t, err)
	_, err = Restore(context.Background(), cp, RestoreOptions{})
	require.ErrorIs(t, err, ErrInvalidConfig, "a directory others can write")
}

// Checkpoints are listed oldest first, by label, opened by ID or path,
// and removed whole; what is not podvm's is passed over by List and
// refused by Open and Remove.
func TestCheckpointStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := storeDir(t)
	in := WithCheckpointDir(dir)
	now := time.Now()
	newer := fakeCheckpoint(t, dir, now, map[string]string{"k": "v"})
	older := fakeCheckpoint(t, dir, now.Add(-time.Hour), nil)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o600))
	foreign := randomHex()
	require.NoError(t, os.WriteFile(filepath.Join(dir, foreign+".json"), []byte(`{"version":1,"id":"`+foreign+`"}`), 0o600))

	list, err := ListCheckpoints(ctx, in)
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, []string{older, newer}, []string{list[0].ID, list[1].ID}, "oldest first")
	list, err = ListCheckpoints(ctx, in, WithLabel("k", "v"))
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, newer, list[0].ID)
	none, err := ListCheckpoints(ctx, WithCheckpointDir(filepath.Join(dir, "missing")))
	require.NoError(t, err)
	assert.Empty(t, none)

	cp, err := OpenCheckpoint(newer, in)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, newer+".tar"), cp.Path)
	byPath, err := OpenCheckpoint(cp.Path)
	require.NoError(t, err)
	assert.Equal(t, newer, byPath.ID)
	_, err = OpenCheckpoint(foreign, in)
	require.ErrorIs(t, err, ErrInvalidCheckpoint)
	_, err = OpenCheckpoint("nothing", in)
	require.ErrorIs(t, err, ErrInvalidCheckpoint)
	_, err = OpenCheckpoint(randomHex(), in)
	require.ErrorIs(t, err, ErrCheckpointNotFound)
	require.NoError(t, os.Remove(filepath.Join(dir, older+".tar")))
	_, err = OpenCheckpoint(older, in)
	require.ErrorIs(t, err, ErrCheckpointNotFound, "its archive is gone")

	require.ErrorIs(t, RemoveCheckpoint(ctx, foreign, in), ErrInvalidCheckpoint)
	require.NoError(t, RemoveCheckpoint(ctx, older, in), "what is left of it")
	require.NoError(t, RemoveCheckpoint(ctx, cp.Path))
	require.ErrorIs(t, RemoveCheckpoint(ctx, newer, in), ErrCheckpointNotFound)
	list, err = ListCheckpoints(ctx, in)
	require.NoError(t, err)
	assert.Empty(t, list)

	_, err = Restore(ctx, &Checkpoint{ID: newer}, RestoreOptions{})
	require.ErrorIs(t, err, ErrInvalidCheckpoint, "a Checkpoint not from this package")
	_, err = Restore(ctx, nil, RestoreOptions{})
	require.ErrorIs(t, err, ErrInvalidCheckpoint)
	_, err = Restore(ctx, cp, RestoreOptions{})
	require.ErrorIs(t, err, ErrCheckpointNotFound, "removed")
	kept, err := OpenCheckpoint(fakeCheckpoint(t, dir, now, nil), in)
	require.NoError(t, err)
	_, err = Restore(ctx, kept, RestoreOptions{Name: "bad name"})
	require.ErrorIs(t, err, ErrInvalidConfig)
	kept.meta.Agent = "sha256:another"
	_, err = Restore(ctx, kept, RestoreOptions{})
	require.ErrorIs(t, err, ErrNotSupported, "another podvm's agent")
}

// Reap with WithCheckpoints removes the checkpoints of owners that are
// gone, and the half-written files of dead processes, even when no
// Podman answers; it keeps the others.
func TestReapCheckpoints(t *testing.T) {
	t.Parallel()
	if self() == "" {
		t.Skip("/proc cannot name this process: no owner is judged")
	}
	dir := storeDir(t)
	ours := fakeCheckpoint(t, dir, time.Now(), nil)
	o, _ := parseOwner(self())
	o.start++ // the PID now names another process: its maker is gone
	gone := fakeCheckpoint(t, dir, time.Now(), map[string]string{LabelOwner: o.String()})
	deadPIDFile := "." + strconv.Itoa(deadPID(t)) + "-" + randomHex() + ".partial"
	goneOwnerFile := "." + o.String() + "-" + randomHex() + ".restore"
	live := spoolName(randomHex(), "restore")
	oldOrphan, newOrphan, notOurs := randomHex()+".tar", randomHex()+".tar", randomHex()+".tar"
	for _, f := range []string{deadPIDFile, goneOwnerFile, live, "other.partial", notOurs} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), nil, 0o600))
	}
	for _, f := range []string{oldOrphan, newOrphan} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), tinyArchive(t), 0o600))
	}
	long := time.Now().Add(-time.Hour)
	for _, f := range []string{oldOrphan, notOurs} {
		require.NoError(t, os.Chtimes(filepath.Join(dir, f), long, long))
	}

	removed, err := Reap(context.Background(), 0, WithCheckpoints(), WithCheckpointDir(dir),
		WithBackend(BackendAPI), WithURL("unix://"+filepath.Join(dir, "no.sock")))
	require.ErrorIs(t, err, ErrUnavailable, "no Podman answers")
	assert.Equal(t, []string{gone}, removed)
	for f, want := range map[string]bool{ours + ".json": true, ours + ".tar": true, gone + ".json": false, gone + ".tar": false,
		deadPIDFile: false, goneOwnerFile: false, live: true, oldOrphan: false, newOrphan: true, "other.partial": true, notOurs: true} {
		_, err := os.Stat(filepath.Join(dir, f))
		assert.Equal(t, want, err == nil, "%s kept: want %v", f, want)
	}
	require.NoError(t, RemoveCheckpoint(context.Background(), filepath.Join(dir, newOrphan)), "an archive without its metadata")
	_, err = os.Stat(filepath.Join(dir, newOrphan))
	assert.ErrorIs(t, err, os.ErrNotExist)
	require.ErrorIs(t, RemoveCheckpoint(context.Background(), filepath.Join(dir, notOurs)), ErrInvalidCheckpoint, "a file that is no checkpoint's archive")
	assert.FileExists(t, filepath.Join(dir, notOurs))
}

// tinyArchive is the smallest archive a restore would take: config.dump,
// spec.dump and CRIU's inventory.
func tinyArchive(t *testing.T) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, body := range map[string]string{"config.dump": `{"id":"x"}`, "spec.dump": `{}`, "checkpoint/inventory.img": "inv"} {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return b.Bytes()
}

// deadPID is a PID that names no process.
func deadPID(t *testing.T) int {
	for pid := 4_000_000; pid > 3_000_000; pid -= 7919 {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) && !processAlive(pid) {
			return pid
		}
	}
	t.Skip("no dead PID found")
	return 0
}
