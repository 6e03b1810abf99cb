// Package exec runs commands on the host without a shell, capturing their
// stdout and stderr separately and bounded in memory, with timeouts and
// cancellation that kill the whole process tree.
//
// A [Command] is an argv, never a shell line: its Name and Args reach the
// program byte for byte, so "$(rm -rf /)" is just an argument. An [Executor]
// runs a Command and returns a [Result]. [CommandExecutor] is the host
// implementation; the sandboxes of package
// github.com/podvm/podvm/vm implement the same interface, so code written
// against Executor runs unchanged on the host or in a sandbox, and
// [Restrict] puts a capability [Policy] in front of any of them.
//
// The contract every Executor in podvm keeps:
//
//   - A non-zero exit status is data ([Result.ExitCode]), never an error. A
//     process killed by a signal reports 128+signal.
//   - Invalid input is refused before anything starts, with an error that
//     matches [ErrInvalidCommand] under [errors.Is].
//   - On timeout or cancellation the whole process tree is killed, the partial
//     output is returned in a Result with TimedOut set and ExitCode -1, and the
//     error matches [context.DeadlineExceeded] or [context.Canceled]. How
//     complete "whole" is depends on the executor: for [CommandExecutor]
//     see [Containment] (on Linux, everything the command started, however
//     it detached; elsewhere, its process group).
//   - [Result.Usage] reports the run's CPU time and peak memory where the
//     executor can measure them; a limit ([Command.MaxMemoryBytes],
//     [Command.MaxPids], [Command.MaxCPUTime]) is enforced or the run is
//     refused with [ErrUnsupported], never silently ignored.
//   - Each stream's capture keeps at most MaxOutputBytes (default
//     [DefaultMaxOutputBytes]): the first half and the last half, so errors
//     at the end of a long build survive; memory stays bounded whatever the
//     command prints.
//
// Package exec never invokes a shell and never reads or changes the
// environment of the calling process beyond passing it to children when a
// Command asks for it.
package exec
