package vm

import (
	"fmt"
	"regexp"
	"strings"
)

// This file is how a snapshot's name is checked and read: as TakeSnapshot
// and RemoveSnapshot take it, never as Podman would guess it.

// snapshotRepo is the name of the snapshots podvm names itself.
const snapshotRepo = "localhost/podvm-snapshot"

var (
	// An image name: an optional registry (with a '.' or ':', or
	// localhost) and lowercase path components, as
	// github.com/distribution/reference has them.
	domainRE = regexp.MustCompile(`^(?:localhost|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?)$`)
	pathRE   = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	tagRE    = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127}$`)
	// What Podman's change parsing keeps verbatim in a label.
	labelKeyRE   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._/-]*$`)
	labelValueRE = regexp.MustCompile(`^[^\s,"'\\\x00-\x1f\x7f]*$`)
	// What Podman looks up as an image ID, or a prefix of one (a single
	// digit will do), before it looks for a name without a registry.
	hexRE = regexp.MustCompile(`^[0-9a-f]+$`)
	// An image's full ID, as Snapshot.ID holds it.
	idRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// reference returns the repository (with its registry) and tag the
// snapshot is named by, or ErrInvalidSnapshot.
func (o SnapshotOptions) reference() (repo, tag string, err error) {
	for k, v := range o.Labels {
		if !labelKeyRE.MatchString(k) || len(k) > 256 || !labelValueRE.MatchString(v) || len(v) > 4096 {
			return "", "", fmt.Errorf("%w: label %q=%q: want a key of letters, digits, '.', '_', '/', '-' and a value without blanks, commas, quotes or backslashes", ErrInvalidSnapshot, k, v)
		}
	}
	if o.Name == "" {
		return snapshotRepo, randomHex(), nil
	}
	return parseName(o.Name)
}

// parseName splits an image name[:tag] into its full repository and
// tag, or fails with ErrInvalidSnapshot.
func parseName(name string) (repo, tag string, err error) {
	bad := func(why string) (string, string, error) {
		return "", "", fmt.Errorf("%w: name %q is not an image reference: %s", ErrInvalidSnapshot, name, why)
	}
	if len(name) > 255 {
		return bad("longer than 255 bytes")
	}
	repo, tag = name, "latest"
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		repo, tag = name[:i], name[i+1:]
		if !tagRE.MatchString(tag) {
			return bad("want a tag of letters, digits, '_', '.', '-', at most 128")
		}
	}
	if strings.Contains(repo, "@") {
		return bad("a digest cannot be chosen")
	}
	parts := strings.Split(repo, "/")
	switch {
	case len(parts) > 1 && (strings.ContainsAny(parts[0], ".:") || parts[0] == "localhost"):
		if !domainRE.MatchString(parts[0]) {
			return bad("want a registry host[:port]")
		}
		parts = parts[1:]
	case hexRE.MatchString(repo) || repo == "sha256":
		return bad("Podman would take it, or its :latest, for an image ID or a prefix of one; name it localhost/" + name + " if that is meant")
	default:
		repo = "localhost/" + repo
	}
	for _, p := range parts {
		if !pathRE.MatchString(p) {
			return bad("want lowercase letters and digits separated by '.', '_', '__' or '-', and '/'")
		}
	}
	return repo, tag, nil
}

// removeRef checks a reference given to RemoveSnapshot, a snapshot's
// full ID or a name that TakeSnapshot would take (checked by parseName,
// as TakeSnapshot checks it), and returns it as Podman is given it: an ID
// as it is, a name in full (repo:tag). name reports which it is.
func removeRef(ref string) (full string, name bool, err error) {
	if idRE.MatchString(ref) {
		return ref, false, nil
	}
	repo, tag, err := parseName(ref)
	if err != nil {
		return "", false, fmt.Errorf("%w (nor a snapshot's full ID)", err)
	}
	return repo + ":" + tag, true, nil
}
