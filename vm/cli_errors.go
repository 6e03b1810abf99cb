package vm

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/podvm/podvm/exec"
)

// CLIError is a podman invocation that failed: [CLIVM]'s errors wrap one,
// next to the sentinel it was mapped to, so that [errors.As] reaches what
// podman said.
type CLIError struct {
	// Op is podman's subcommand: "run", "exec", "cp", "rm".
	Op string
	// ExitCode is podman's exit status.
	ExitCode int
	// Stderr is podman's standard error, as captured.
	Stderr string
}

// Error returns podman's error lines, without their "Error: " prefixes.
func (e *CLIError) Error() string {
	var msgs []string
	for _, l := range strings.Split(e.Stderr, "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(l), "Error: "); ok {
			msgs = append(msgs, m)
		}
	}
	if len(msgs) == 0 {
		msgs = append(msgs, strings.TrimSpace(e.Stderr))
	}
	return fmt.Sprintf("podman %s exited %d: %s", e.Op, e.ExitCode, strings.Join(msgs, "; "))
}

// cliMessages are the podman 4.3 messages cliError recognises, most
// specific first, each with the sentinel it means. The samples they were
// written from are in testdata/podman-stderr.
var cliMessages = []struct {
	re  *regexp.Regexp
	err error
}{
	// exec: runc could not start the command.
	{regexp.MustCompile(`chdir to cwd \(.*\) set in config\.json failed`), exec.ErrDirNotFound},
	{regexp.MustCompile(`OCI runtime attempted to invoke a command that was not found`), exec.ErrNotFound},
	{regexp.MustCompile(`OCI permission denied`), exec.ErrPermission},
	// The container.
	{regexp.MustCompile(`no such container|Error: container ".*" does not exist`), ErrNoSuchContainer},
	{regexp.MustCompile(`container state improper`), ErrContainerNotRunning},
	{regexp.MustCompile(`that name is already in use`), ErrNameInUse},
	// The image: absent under --pull never, or no registry gave it.
	{regexp.MustCompile(`image not known|initializing source docker://|did not resolve to an alias|manifest unknown`), ErrImageNotFound},
	// The service.
	{regexp.MustCompile(`Cannot connect to Podman|unable to connect to Podman socket`), ErrUnavailable},
	// Known, with no better sentinel than ErrPodman.
	{regexp.MustCompile(`unable to find user`), ErrPodman},
}

// recognise returns the sentinel for the first message of cliMessages
// found in stderr, or nil.
func recognise(stderr string) error {
	for _, m := range cliMessages {
		if m.re.MatchString(stderr) {
			return m.err
		}
	}
	return nil
}

// cliError maps a failed podman invocation to an error wrapping a vm
// sentinel ([ErrNoSuchContainer], [ErrContainerNotRunning],
// [ErrImageNotFound], [ErrNameInUse], [ErrUnavailable], [ErrPodman] when
// none fits) or, for an exec that never started the command,
// [exec.ErrNotFound], [exec.ErrPermission] or [exec.ErrDirNotFound]; and a
// [*CLIError] carrying podman's stderr. what names the object of the call
// (the command for exec); it may be empty.
func cliError(op, what string, res *exec.Result) error {
	e := &CLIError{Op: op, ExitCode: res.ExitCode, Stderr: res.Stderr}
	sentinel := recognise(res.Stderr)
	if sentinel == nil {
		sentinel = ErrPodman
	}
	if what == "" {
		return fmt.Errorf("%w: %w", sentinel, e)
	}
	return fmt.Errorf("%w: %s: %w", sentinel, what, e)
}

// execFailed reports whether res, from `podman exec`, is podman failing
// rather than the command exiting: the command's own status, 125 to 127
// and 255 included, is data. Podman fails with 125 (255 from the local
// client), 126 or 127 (runc could not execute the command), prints
// nothing on stdout and only its own lines on stderr ("Error: ...", and
// the notice that it cannot connect). Beyond 125, its
// message must also be one cliError knows, so that a command exiting 127
// after printing "Error: ..." keeps its status.
func execFailed(res *exec.Result) bool {
	switch res.ExitCode {
	case 125, 126, 127, 255:
	default:
		return false
	}
	if res.StdoutBytes != 0 || strings.TrimSpace(res.Stderr) == "" {
		return false
	}
	for _, l := range strings.Split(strings.TrimSpace(res.Stderr), "\n") {
		if !strings.HasPrefix(l, "Error: ") && !strings.HasPrefix(l, "Cannot connect to Podman.") {
			return false
		}
	}
	return res.ExitCode == 125 || recognise(res.Stderr) != nil
}
