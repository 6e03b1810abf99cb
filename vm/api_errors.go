package vm

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/libpod"
)

// apiMessages are the libpod causes and messages apiError recognises,
// each with the sentinel it means, whatever the HTTP status (Podman 4.3
// answers a name conflict with 500, a stopped container with 409 or 500).
// The answers they were written from are in testdata/libpod.
var apiMessages = []struct {
	re  *regexp.Regexp
	err error
}{
	{regexp.MustCompile(`no such container|no container with name or ID`), ErrNoSuchContainer},
	{regexp.MustCompile(`container state improper|is not running`), ErrContainerNotRunning},
	{regexp.MustCompile(`that name is already in use`), ErrNameInUse},
	// Absent from the service, or no registry gave it.
	{regexp.MustCompile(`image not known|failed to find image|no such image|initializing source docker://|did not resolve to an alias|manifest unknown`), ErrImageNotFound},
}

// apiError maps an error of internal/libpod to the vm sentinel it means,
// wrapping both: [ErrUnavailable] when no answer came (the socket is gone,
// the dial failed, the connection dropped, mid-stream included);
// [ErrNoSuchContainer], [ErrImageNotFound], [ErrNameInUse] or
// [ErrContainerNotRunning] for the libpod messages of apiMessages; and
// [ErrPodman] for any other failure. A context's error is not a failure of
// Podman: it is wrapped with no sentinel, so that [errors.Is] still finds
// [context.Canceled] or [context.DeadlineExceeded]. what names the object
// of the call (the image, the command, the path); it may be empty.
func apiError(op, what string, err error) error {
	if what != "" {
		op += " " + what
	}
	var le *libpod.Error
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("vm: %s: %w", op, err)
	case !errors.As(err, &le):
		return fmt.Errorf("%w: %s: %w", ErrPodman, op, err)
	case le.Unreachable():
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
	}
	for _, m := range apiMessages {
		if m.re.MatchString(le.Cause) || m.re.MatchString(le.Message) {
			return fmt.Errorf("%w: %s: %w", m.err, op, err)
		}
	}
	return fmt.Errorf("%w: %s: %w", ErrPodman, op, err)
}

// execFailurePrefix starts each line the service writes on an exec
// stream's stderr when runc could not start the command (on 4.3 a second
// line reports the attach socket's reset); the session then exits 126 or
// 127.
const execFailurePrefix = "Error: "

// apiExecFailed returns an error when a session's outcome is the service
// failing to start the command rather than the command's own exit: status
// 126 or 127, no stdout, and a stderr made only of "Error: " lines among
// which runc's message for a missing command ([exec.ErrNotFound]), a
// file it may not execute ([exec.ErrPermission]) or a missing working
// directory ([exec.ErrDirNotFound]); the messages are those cliError
// knows. stderrHead is the start of stderr, stderrTotal its full length.
// A command that prints such a line itself and exits 127 keeps its status
// unless it mimics the whole message.
func apiExecFailed(name string, code int, stdoutTotal int64, stderrHead string, stderrTotal int64) error {
	if (code != 126 && code != 127) || stdoutTotal != 0 || stderrTotal == 0 || int64(len(stderrHead)) != stderrTotal {
		return nil
	}
	lines := strings.Split(strings.TrimSpace(stderrHead), "\n")
	for _, l := range lines {
		if !strings.HasPrefix(l, execFailurePrefix) {
			return nil
		}
	}
	switch s := recognise(stderrHead); s {
	case exec.ErrNotFound, exec.ErrPermission, exec.ErrDirNotFound:
		msg := strings.TrimPrefix(lines[0], execFailurePrefix)
		return fmt.Errorf("%w: %s: podman: %s", s, name, msg)
	}
	return nil
}
