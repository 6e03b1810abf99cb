package vm

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/podvm/podvm/internal/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseName(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, repo, tag string }{
		{"prepared", "localhost/prepared", "latest"},
		{"prepared:go1.25", "localhost/prepared", "go1.25"},
		{"team/prepared:v_1-2", "localhost/team/prepared", "v_1-2"},
		{"localhost/x", "localhost/x", "latest"},
		{"registry.example:5000/a/b:c", "registry.example:5000/a/b", "c"},
		{"a__b.c-d", "localhost/a__b.c-d", "latest"},
	} {
		repo, tag, err := parseName(c.name)
		if assert.NoError(t, err, c.name) {
			assert.Equal(t, c.repo+":"+c.tag, repo+":"+tag, c.name)
		}
	}
	for _, bad := range []string{"", "Upper", "-x", "a b", "x:", "x:-t", "x@sha256:00", "a..b", "/x", "x/", "a//b", "x:" + strings.Repeat("t", 129), strings.Repeat("a", 256), "a,b", "a\x00",
		"x:tag:tag", "UPPER",
		// What Podman would resolve as an image ID, or a prefix of one.
		strings.Repeat("0123456789abcdef", 4), "abc", "cafe", "a", "0", "deadbeef:v1", "sha256:" + strings.Repeat("ab", 32)} {
		_, _, err := parseName(bad)
		assert.ErrorIs(t, err, ErrInvalidSnapshot, "%q", bad)
	}
	// A registry, or a letter past f, makes a name unambiguous.
	for _, good := range []string{"localhost/abc", "localhost/" + strings.Repeat("ab", 32), "cafe-au-lait", "abcg", "x/abc"} {
		_, _, err := parseName(good)
		assert.NoError(t, err, good)
	}
}

// fakeImager is a Podman whose commits fail after making part of the
// image, as one whose storage fills up midway might.
type fakeImager struct {
	images    map[string]driver.Image // by ID
	n         int                     // images committed
	commitErr error
	removed   []string
}

func (f *fakeImager) Commit(_ context.Context, id, repo, tag string, changes []string) (string, error) {
	labels := map[string]string{}
	for _, ch := range changes {
		k, v, _ := strings.Cut(strings.TrimPrefix(ch, "LABEL "), "=")
		labels[k] = v
	}
	ref := repo + ":" + tag
	for id, img := range f.images { // as Podman does, the name moves
		img.Names = slices.DeleteFunc(slices.Clone(img.Names), func(n string) bool { return n == ref })
		f.images[id] = img
	}
	f.n++
	img := driver.Image{ID: fmt.Sprintf("%064d", f.n), Names: []string{ref}, History: []string{ref}, Labels: labels}
	f.images[img.ID] = img
	if f.commitErr != nil {
		return "", f.commitErr
	}
	return img.ID, nil
}

func (f *fakeImager) ImageDetails(_ context.Context, ref string) (driver.Image, error) {
	for _, img := range f.images {
		if img.ID == ref || (len(img.Names) > 0 && img.Names[0] == ref) {
			return img, nil
		}
	}
	return driver.Image{}, fmt.Errorf("%w: %s", ErrImageNotFound, ref)
}

func (f *fakeImager) Images(_ context.Context, label string) ([]driver.Image, error) {
	k, v, _ := strings.Cut(label, "=")
	var out []driver.Image
	for _, img := range f.images {
		if img.Labels[k] == v {
			out = append(out, img)
		}
	}
	return out, nil
}

func (f *fakeImager) RemoveImage(_ context.Context, ref string) error {
	for id, img := range f.images {
		if id == ref || (len(img.Names) > 0 && img.Names[0] == ref) {
			delete(f.images, id)
			f.removed = append(f.removed, ref)
			return nil
		}
	}
	return fmt.Errorf("%w: %s", ErrImageNotFound, ref)
}

// A commit that fails after Podman made part of the image (its storage
// full, the sandbox removed midway) leaves nothing: what carries the
// snapshot's token is removed, and the error is Podman's.
func TestSnapshotFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	full := fmt.Errorf("%w: podman commit exited 125: writing blob: no space left on device", ErrPodman)
	f := &fakeImager{images: map[string]driver.Image{}, commitErr: full}
	_, err := takeSnapshot(context.Background(), f, "c0ffee", "localhost/x", "latest", SnapshotOptions{})
	require.ErrorIs(t, err, ErrPodman)
	assert.Contains(t, err.Error(), "no space left on device")
	assert.Empty(t, f.images, "the half-made snapshot is left")
	assert.Equal(t, []string{"localhost/x:latest"}, f.removed)
}

// A name of an image podvm did not make is refused before any commit,
// unless Replace; a snapshot's name moves, its old image goes.
func TestSnapshotNameTaken(t *testing.T) {
	t.Parallel()
	users := driver.Image{ID: strings.Repeat("a", 64), Names: []string{"localhost/x:latest"}, Labels: map[string]string{"team": "mine"}}
	f := &fakeImager{images: map[string]driver.Image{users.ID: users}}
	_, err := takeSnapshot(context.Background(), f, "c0ffee", "localhost/x", "latest", SnapshotOptions{Name: "x"})
	require.ErrorIs(t, err, ErrImageExists)
	assert.Len(t, f.images, 1, "something was committed")
	snap, err := takeSnapshot(context.Background(), f, "c0ffee", "localhost/x", "latest", SnapshotOptions{Name: "x", Replace: true})
	require.NoError(t, err)
	assert.Equal(t, "localhost/x:latest", snap.Image)
	assert.Contains(t, f.images, users.ID, "the user's image was removed")
	assert.Empty(t, f.removed)
	assert.Equal(t, "true", snap.Labels[LabelSnapshot])
	assert.Equal(t, "", snap.Labels[LabelManaged])
	assert.Equal(t, "c0ffee", snap.Source)
}

// Every call that takes a snapshot's name checks it as TakeSnapshot does,
// before Podman is asked (the mock expects no call but podman info): a
// name TakeSnapshot refuses is never sent to Podman to resolve.
func TestSnapshotNamesCheckedBeforePodman(t *testing.T) {
	t.Parallel()
	v, _ := newMock(t, Config{Image: "img"})
	ctx := context.Background()
	for _, bad := range []string{"UPPER", "x:tag:tag", "abc", "sha256:" + strings.Repeat("ab", 32), strings.Repeat("ab", 31), "-f", "a b"} {
		_, err := TakeSnapshot(ctx, v, SnapshotOptions{Name: bad})
		assert.ErrorIs(t, err, ErrInvalidSnapshot, "take %q", bad)
		assert.ErrorIs(t, RemoveSnapshot(ctx, v, bad), ErrInvalidSnapshot, "remove %q", bad)
		assert.ErrorIs(t, v.RemoveSnapshot(ctx, bad), ErrInvalidSnapshot, "the Snapshotter's remove %q", bad)
		_, err = v.Snapshot(ctx, SnapshotOptions{Name: bad})
		assert.ErrorIs(t, err, ErrInvalidSnapshot, "the Snapshotter's take %q", bad)
	}
}

// A snapshot that loses its name to another goes, whichever call took
// the name: not one a commit has yet to name (it has no history of
// names), one that lost another name, nor an image podvm did not make.
func TestSnapshotLostNameGoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	snapshot := map[string]string{LabelSnapshot: "true"}
	f := &fakeImager{images: map[string]driver.Image{}}
	for _, img := range []driver.Image{
		{ID: "committing", Labels: snapshot},
		{ID: "lost-another", History: []string{"localhost/y:latest"}, Labels: snapshot},
		{ID: "users", History: []string{"localhost/x:latest"}},
		// Lost the name in a race whose winner's call did not see it.
		{ID: "lost-earlier", History: []string{"localhost/x:latest"}, Labels: snapshot},
	} {
		f.images[img.ID] = img
	}
	var ids []string
	for range 3 {
		snap, err := takeSnapshot(ctx, f, "c0ffee", "localhost/x", "latest", SnapshotOptions{Name: "x"})
		require.NoError(t, err)
		ids = append(ids, snap.ID)
	}
	assert.ElementsMatch(t, []string{"committing", "lost-another", "users", ids[2]}, slices.Collect(maps.Keys(f.images)))

	// RemoveSnapshot of a name does as much: here for what a sandbox
	// used when the name moved.
	f.images["was-in-use"] = driver.Image{ID: "was-in-use", History: []string{"localhost/x:latest"}, Labels: snapshot}
	require.NoError(t, removeSnapshot(ctx, f, "x"))
	assert.ElementsMatch(t, []string{"committing", "lost-another", "users"}, slices.Collect(maps.Keys(f.images)))
}
