package vm

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"strings"
	"syscall"
)

// This file is how the file calls check their paths and name their
// failures: one sentinel for one failure, whichever way the call went.

// sandboxFile cleans p, an absolute path in the sandbox other than "/".
// For "/" it returns "/" and an error.
func cleanFile(op, p string) (string, error) {
	c, err := cleanPath(op, p)
	if err == nil && c == "/" {
		return c, fmt.Errorf("vm: %s %q: %w: want a path below /", op, p, fs.ErrInvalid)
	}
	return c, err
}

// cleanPath cleans p, which must be an absolute path in the sandbox,
// without NUL bytes, and not too long ([checkLength]).
func cleanPath(op, p string) (string, error) {
	if !path.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("vm: %s %q: %w: want an absolute path in the sandbox", op, p, fs.ErrInvalid)
	}
	c := path.Clean(p)
	return c, checkLength(op, c)
}

// checkLength refuses p, a clean path, when the kernel would: a path
// that is too long, or a name in it that is, matches
// [syscall.ENAMETOOLONG]. The check is the host's, so that every way a
// call travels says the same (Podman's copies say the path is missing).
func checkLength(op, p string) error {
	if len(p) >= pathMax {
		return fmt.Errorf("vm: %s %.64s...: %w (%d bytes, over %d)", op, p, syscall.ENAMETOOLONG, len(p), pathMax-1)
	}
	for name := range strings.SplitSeq(p, "/") {
		if len(name) > nameMax {
			return fmt.Errorf("vm: %s %s: %w (a name of %d bytes, over %d)", op, p, syscall.ENAMETOOLONG, len(name), nameMax)
		}
	}
	return nil
}

// notExistMessages are the backends' messages for a sandbox path that is
// missing: CopyOut's (the socket's 404 and `podman cp`'s), and CopyIn's
// for a destination directory that is missing (the socket backend's) or
// missing or not a directory (`podman cp` cannot tell which).
var notExistMessages = regexp.MustCompile(`no such file or directory|no such directory in the sandbox|destination must be a directory when copying from stdin`)

// errnoMessages are the system's messages for the failures of the file
// calls that have a sentinel of their own, as the copies pass them on
// (Podman's service, in a libpod error; the local podman, on stderr;
// podman-remote's cp passes none; tar in a pod, strerror's capitalised),
// most specific first. A message of the
// copier naming a path that could not be found is followed by its cause.
var errnoMessages = []struct {
	re  *regexp.Regexp
	err error
}{
	{regexp.MustCompile(`(?i)too many levels of symbolic links`), syscall.ELOOP},
	{regexp.MustCompile(`(?i)read-only file system`), syscall.EROFS},
	{regexp.MustCompile(`(?i)file name too long`), syscall.ENAMETOOLONG},
	{regexp.MustCompile(`(?i)no space left on device|disk quota exceeded`), syscall.ENOSPC},
	{regexp.MustCompile(`(?i)permission denied|operation not permitted`), fs.ErrPermission},
	{regexp.MustCompile(`(?i): is a directory`), syscall.EISDIR},
	{regexp.MustCompile(`(?i): not a directory`), syscall.ENOTDIR},
}

// noItems is the local podman's message for a copy out of a path it
// leaves out (a device, a socket): its service sends an empty archive.
var noItems = regexp.MustCompile(`copier: get: copied no items`)

// copyError returns err, a VM's error for a copy of p, as the file
// calls report it: one that Podman failed (or reported as a missing
// path) for a reason the system named matches that reason's sentinel
// alone ([errnoMessages]), wrapping what Podman said (a [CLIError] or
// [APIError]) but no longer [ErrPodman] or [fs.ErrNotExist]; one that
// says that a path is missing matches [fs.ErrNotExist]; one of a path
// that Podman leaves out of its copies matches [errNoEntry]. It returns
// nil for any other error.
func copyError(op, p string, err error) error {
	if !errors.Is(err, ErrPodman) && !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	msg := err.Error()
	var ce *CLIError
	if errors.As(err, &ce) {
		msg += "\n" + ce.Stderr // the copier's lines, which Error leaves out
	}
	if noItems.MatchString(msg) { // what Podman's service sends as an empty archive
		return fmt.Errorf("%w: %s %s: %w: %w", ErrPodman, op, p, errNoEntry, nativeError(err))
	}
	for _, m := range errnoMessages {
		if m.re.MatchString(msg) {
			return fmt.Errorf("vm: %s %s: %w: %w", op, p, m.err, nativeError(err))
		}
	}
	if errors.Is(err, ErrPodman) && notExistMessages.MatchString(msg) {
		return fmt.Errorf("vm: %s %s: %w: %w", op, p, fs.ErrNotExist, nativeError(err))
	}
	return nil
}

// nativeError is what Podman said in err: its [CLIError] or [APIError],
// else err's message alone, matching no sentinel.
func nativeError(err error) error {
	var ce *CLIError
	if errors.As(err, &ce) {
		return ce
	}
	var ae *APIError
	if errors.As(err, &ae) {
		return ae
	}
	return errors.New(err.Error())
}

// fileError returns err, a VM's error for a copy of p, as the file
// calls report it ([copyError]).
func fileError(op, p string, err error) error {
	if e := copyError(op, p, err); e != nil {
		return e
	}
	return err
}

// The kernel's limits on a path (Linux's, whatever the sandbox's
// filesystem): a name of up to nameMax bytes, a path of fewer than
// pathMax (PATH_MAX counts the NUL at its end).
const (
	nameMax = 255
	pathMax = 4096
)
