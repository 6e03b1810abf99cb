package vm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// restoredCopy is a copy a fake restore made: already running, so that
// a Create on it is a defect of the pool's.
type restoredCopy struct {
	VM // nil: any other call panics
	id string

	mu      sync.Mutex
	removed bool
}

func (c *restoredCopy) ID() string { return c.id }

func (c *restoredCopy) Create(context.Context) error {
	panic("the pool created a copy a restore had made")
}

func (c *restoredCopy) Remove(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removed = true
	return nil
}

// A restore pool hands out what restore made, never creating it again,
// each copy labelled with the pool.
func TestRestorePool(t *testing.T) {
	t.Parallel()
	dir := storeDir(t)
	cp, err := OpenCheckpoint(fakeCheckpoint(t, dir, time.Now(), nil), WithCheckpointDir(dir))
	require.NoError(t, err)

	var (
		mu     sync.Mutex
		copies []*restoredCopy
		seen   []RestoreOptions
	)
	restore := func(_ context.Context, got *Checkpoint, ro RestoreOptions) (VM, error) {
		assert.Same(t, cp, got)
		mu.Lock()
		defer mu.Unlock()
		c := &restoredCopy{id: "copy-" + string(rune('a'+len(copies)))}
		copies, seen = append(copies, c), append(seen, ro)
		return c, nil
	}
	mine := map[string]string{"suite": "restore-pool"}
	p, err := NewRestorePool(cp, RestoreOptions{Labels: mine}, restore, WithPoolSize(2))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"suite": "restore-pool"}, mine, "the caller's labels are left as they were")

	ctx := context.Background()
	v, err := p.Get(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return p.Stats().Ready == 2 }, 10*time.Second, time.Millisecond)
	mu.Lock()
	require.Len(t, seen, 3)
	for _, ro := range seen {
		assert.Equal(t, map[string]string{"suite": "restore-pool", LabelPool: p.ID()}, ro.Labels)
		assert.Empty(t, ro.Name)
	}
	mu.Unlock()
	mu.Lock()
	assert.Contains(t, []string{copies[0].id, copies[1].id}, v.ID(), "one of the first two restores")
	mu.Unlock()
	require.NoError(t, v.Remove(ctx))
	require.NoError(t, p.Close(ctx))
	mu.Lock()
	defer mu.Unlock()
	for _, c := range copies {
		assert.True(t, c.removed, "%s is left", c.id)
	}
}

// What NewRestorePool can know is wrong is refused before anything
// starts; a restore that fails, or returns nothing, fails the Get.
func TestRestorePoolRefusals(t *testing.T) {
	t.Parallel()
	never := func(context.Context, *Checkpoint, RestoreOptions) (VM, error) {
		t.Error("a refused pool restored")
		return nil, nil
	}
	_, err := NewRestorePool(nil, RestoreOptions{}, never)
	require.ErrorIs(t, err, ErrInvalidCheckpoint)
	_, err = NewRestorePool(&Checkpoint{}, RestoreOptions{}, never)
	require.ErrorIs(t, err, ErrInvalidCheckpoint)

	dir := storeDir(t)
	cp, err := OpenCheckpoint(fakeCheckpoint(t, dir, time.Now(), nil), WithCheckpointDir(dir))
	require.NoError(t, err)
	_, err = NewRestorePool(cp, RestoreOptions{Name: "one"}, never)
	require.ErrorIs(t, err, ErrInvalidConfig)
	other := *cp
	other.meta.Agent = "sha256:another"
	_, err = NewRestorePool(&other, RestoreOptions{}, never)
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = NewRestorePool(cp, RestoreOptions{Labels: map[string]string{"a=b": "c"}}, never)
	require.ErrorIs(t, err, ErrInvalidConfig, "a label no Config takes")

	gone := errors.New("the service cannot restore")
	half := &restoredCopy{id: "half-made"}
	for _, tt := range []struct {
		name    string
		restore func(context.Context, *Checkpoint, RestoreOptions) (VM, error)
		want    error
	}{
		{"error", func(context.Context, *Checkpoint, RestoreOptions) (VM, error) { return nil, gone }, gone},
		{"nil VM", func(context.Context, *Checkpoint, RestoreOptions) (VM, error) { return nil, nil }, ErrInvalidConfig},
		{"a VM and an error", func(context.Context, *Checkpoint, RestoreOptions) (VM, error) { return half, gone }, gone},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := NewRestorePool(cp, RestoreOptions{}, tt.restore, WithPoolSize(0))
			require.NoError(t, err)
			defer p.Close(context.Background())
			_, err = p.Get(context.Background())
			require.ErrorIs(t, err, tt.want)
		})
	}
	t.Cleanup(func() { // after the parallel subtests
		half.mu.Lock()
		defer half.mu.Unlock()
		assert.True(t, half.removed, "what a failed restore returned is removed")
	})
}

// A copy's labels are its source's, less the pool the source came from:
// Reap of that pool must not take the copy. A pool's copies get their own.
func TestCopyLabels(t *testing.T) {
	t.Parallel()
	cp := &Checkpoint{ID: "c", meta: checkpointMeta{ID: "c", Config: Config{Image: "img",
		Labels: map[string]string{LabelPool: "the-source's", "suite": "s"}}}}
	cfg, err := cp.copyConfig(RestoreOptions{Labels: map[string]string{"mine": "1"}})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"suite": "s", "mine": "1"}, cfg.Labels)
	assert.Equal(t, "the-source's", cp.meta.Config.Labels[LabelPool], "the checkpoint's own left as it was")
	cfg, err = cp.copyConfig(RestoreOptions{Labels: map[string]string{LabelPool: "another"}})
	require.NoError(t, err)
	assert.Equal(t, "another", cfg.Labels[LabelPool])
}
