package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/ckpt"
	"github.com/podvm/podvm/internal/testkit"
)

// uploads is a driver.StreamImporter that reads each upload to its end,
// or to its first limit bytes, and answers with the ID of what it read.
type uploads struct {
	limit   int // 0: read it all
	got     []byte
	readErr error // how the read of the upload ended, nil at its end
}

func (u *uploads) ImportStream(_ context.Context, r io.Reader) (string, error) {
	if u.limit > 0 {
		u.got, u.readErr = io.ReadAll(io.LimitReader(r, int64(u.limit)))
		return "", errors.New("the service stopped reading")
	}
	u.got, u.readErr = io.ReadAll(r)
	if u.readErr != nil {
		return "", fmt.Errorf("the upload: %w", u.readErr)
	}
	info, err := ckpt.Inspect(bytes.NewReader(u.got))
	return info.ID, err
}

// A copy's archive goes to an engine that takes a stream as it is
// rewritten, with no spool file; a rewrite that fails ends the upload
// with an error, never a clean end the engine would take for a whole
// archive.
func TestImportRewritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	const src = "1111111111111111111111111111111111111111111111111111111111111111"
	whole := testkit.Tar(t,
		testkit.Dir("checkpoint", 0o700),
		testkit.File("checkpoint/inventory.img", "inventory", 0o600),
		testkit.File("checkpoint/pages-1.img", strings.Repeat("pages", 50000), 0o600),
		testkit.File("config.dump", `{"id":"`+src+`","name":"src","rootfsImageName":"img","labels":{"a":"b"}}`, 0o600),
		testkit.File("spec.dump", `{"ociVersion":"1.0.0","mounts":[]}`, 0o600),
	)
	archive := filepath.Join(dir, "whole.tar")
	require.NoError(t, os.WriteFile(archive, whole, 0o600))
	cut := filepath.Join(dir, "cut.tar")
	require.NoError(t, os.WriteFile(cut, whole[:len(whole)/2], 0o600))
	id := ckpt.Identity{ID: strings.Repeat("2", 64), Name: "copy", Labels: map[string]string{"c": "d"}}
	// upload plans the copy of the archive at path and uploads it to u.
	upload := func(path string, u *uploads) (string, error) {
		src, plan, err := planCopy(path, id)
		if err != nil {
			return "", err
		}
		defer src.Close()
		return importRewritten(ctx, u, src, plan)
	}

	u := &uploads{}
	got, err := upload(archive, u)
	require.NoError(t, err)
	assert.Equal(t, id.ID, got)
	info, err := ckpt.Inspect(bytes.NewReader(u.got))
	require.NoError(t, err)
	assert.Equal(t, ckpt.Info{ID: id.ID, Name: "copy", Image: "img", Labels: map[string]string{"c": "d"}}, info, "the engine got the copy's identity")

	u = &uploads{}
	_, err = upload(cut, u)
	require.ErrorIs(t, err, ErrInvalidCheckpoint)
	assert.Nil(t, u.got, "a cut archive is refused before any upload")

	// Cut after it was planned: the upload ends with an error, not its end.
	f, plan, err := planCopy(archive, id)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, os.Truncate(archive, int64(len(whole)/2)))
	u = &uploads{}
	_, err = importRewritten(ctx, u, f, plan)
	require.ErrorIs(t, err, ErrInvalidCheckpoint)
	require.Error(t, u.readErr, "the upload of a cut archive ends with an error, not its end")
	require.NoError(t, os.WriteFile(archive, whole, 0o600))

	u = &uploads{limit: 100}
	_, err = upload(archive, u)
	require.ErrorContains(t, err, "the service stopped reading", "the engine's error, once the copy stopped too")

	_, err = upload(filepath.Join(dir, "gone.tar"), &uploads{})
	require.ErrorIs(t, err, ErrCheckpointNotFound)
}
