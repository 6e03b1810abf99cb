package podman

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/libpod"
)

var (
	_ driver.Imager = API{}
	_ driver.Imager = CLI{}
)

// Commit implements [driver.Imager.Commit] with POST /commit.
func (a API) Commit(ctx context.Context, id, repo, tag string, changes []string) (string, error) {
	return again(ctx, layerLost, func() (string, error) {
		img, err := a.c.Commit(ctx, id, repo, tag, changes)
		if err != nil {
			return "", apiError("commit", id, err)
		}
		return img, nil
	})
}

// again calls f until it does not fail with an error transient
// recognises, a bounded number of times.
func again[T any](ctx context.Context, t transient, f func() (T, error)) (T, error) {
	v, err := f()
	for try := 1; try < t.tries && err != nil && t.re.MatchString(err.Error()); try++ {
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(t.pause):
		}
		v, err = f()
	}
	return v, err
}

// transient is a failure of Podman that goes away when the call is
// made again: its message, and how often and how far apart to try.
type transient struct {
	re    *regexp.Regexp
	tries int
	pause time.Duration
}

var (
	// layerLost: Podman's storage can lose a layer a commit just made
	// to an image removal or another commit running at the same time
	// (containers/podman#24598, containers/buildah#5674); the image was
	// not made, and committing again succeeds.
	layerLost = transient{regexp.MustCompile(`layer not known`), 3, 100 * time.Millisecond}
	// imageVanished: an image list or inspect reads every image's record
	// (for its parent, its size), and fails when one is removed while it
	// reads: "retrieving size of image X: ...: locating image with ID X:
	// image not known", "retrieving parent of image X: ...: locating item
	// named "manifest" for image with ID Y ...: file does not exist" (an
	// image half removed), "reading image X: locating image with ID X:
	// image not known" (Podman 4.3 and 5); and when one is half made by
	// a commit or pull beside it: "retrieving parent of image X: ...:
	// reading data blob size "manifest-sha256:..." for "X": size is not
	// known" (Podman 4.3). Asking again, the image is gone or whole and
	// the answer complete. An image not found by the name or ID asked for
	// fails otherwise, and is not retried.
	imageVanished = transient{regexp.MustCompile(`locating (image|item named "[^"]*" for image) with ID|reading data blob size .*: size is not known`), 10, 50 * time.Millisecond}
)

// ImageDetails implements [driver.Imager.ImageDetails].
func (a API) ImageDetails(ctx context.Context, ref string) (driver.Image, error) {
	return again(ctx, imageVanished, func() (driver.Image, error) {
		img, err := a.c.ImageDetails(ctx, ref)
		if err != nil {
			return driver.Image{}, apiError("image inspect", ref, err)
		}
		return img, nil
	})
}

// Images implements [driver.Imager.Images].
func (a API) Images(ctx context.Context, label string) ([]driver.Image, error) {
	return again(ctx, imageVanished, func() ([]driver.Image, error) {
		list, err := a.c.ImageList(ctx, label)
		if err != nil {
			return nil, apiError("image list", "", err)
		}
		return list, nil
	})
}

// RemoveImage implements [driver.Imager.RemoveImage].
func (a API) RemoveImage(ctx context.Context, ref string) error {
	if err := a.c.ImageRemove(ctx, ref); err != nil {
		return apiError("image remove", ref, err)
	}
	return nil
}

// Commit implements [driver.Imager.Commit] with `podman commit --pause=false`.
func (d CLI) Commit(ctx context.Context, id, repo, tag string, changes []string) (string, error) {
	args := []string{"commit", "--pause=false", "-q", "--format", "oci"}
	for _, ch := range changes {
		args = append(args, "--change", ch)
	}
	name := repo
	if tag != "" {
		name += ":" + tag
	}
	res, err := again(ctx, layerLost, func() (string, error) {
		res, err := d.run(ctx, "commit", id, exec.Command{Args: append(args, id, name)})
		if err != nil {
			return "", err
		}
		return res.Stdout, nil
	})
	if err != nil {
		return "", err
	}
	img := strings.TrimSpace(res)
	if _, err := hex.DecodeString(img); err != nil || len(img) != 64 {
		return "", fmt.Errorf("%w: podman commit printed %q, not an image ID", driver.ErrEngine, res)
	}
	return img, nil
}

// ImageDetails implements [driver.Imager.ImageDetails] with `podman image
// inspect`.
func (d CLI) ImageDetails(ctx context.Context, ref string) (driver.Image, error) {
	res, err := again(ctx, imageVanished, func() (*exec.Result, error) {
		return d.run(ctx, "image inspect", ref, exec.Command{Args: []string{"image", "inspect", ref}, MaxOutputBytes: 16 << 20})
	})
	if err != nil {
		return driver.Image{}, err
	}
	var out []libpod.InspectedImage
	if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil || len(out) != 1 {
		return driver.Image{}, fmt.Errorf("%w: podman image inspect %s: unexpected answer (%v)", driver.ErrEngine, ref, err)
	}
	return out[0].Image(), nil
}

// Images implements [driver.Imager.Images] with `podman images`.
func (d CLI) Images(ctx context.Context, label string) ([]driver.Image, error) {
	res, err := again(ctx, imageVanished, func() (*exec.Result, error) {
		return d.run(ctx, "images", "", exec.Command{Args: []string{"images", "--filter", "label=" + label, "--format", "json"}, MaxOutputBytes: 64 << 20})
	})
	if err != nil {
		return nil, err
	}
	var list []libpod.ListedImage
	if err := json.Unmarshal([]byte(res.Stdout), &list); err != nil {
		return nil, fmt.Errorf("%w: podman images: %v", driver.ErrEngine, err)
	}
	return libpod.Images(list), nil
}

// RemoveImage implements [driver.Imager.RemoveImage] with `podman rmi`.
func (d CLI) RemoveImage(ctx context.Context, ref string) error {
	_, err := d.run(ctx, "rmi", ref, exec.Command{Args: []string{"rmi", ref}})
	return err
}
