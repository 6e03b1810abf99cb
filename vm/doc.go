// Package vm runs commands in throw-away Podman sandboxes.
//
// A [VM] is an [github.com/podvm/podvm/exec.Executor] whose commands run in a
// container: the same Command in, the same Result out, so code written for
// the host runs unchanged in a sandbox. Two backends keep one contract:
// [APIVM] speaks the Podman REST API over its socket (unix://, tcp://,
// ssh://) and [CLIVM] drives the podman command through an Executor.
// [New] picks the socket when one answers and falls back to the CLI.
//
// Sandboxes are locked down by default: no network, no-new-privileges, a
// small capability set, a pids limit and no host environment (see
// [Config]). Every sandbox carries the label [LabelManaged] and labels
// naming its owner, the process that made it: [LabelOwner] (its boot, PID
// namespace, pid and start time), and the older [LabelOwnerPID] and
// [LabelOwnerHost]. So [Reap] removes the sandboxes a crashed process
// left behind, and no live process's, even one of another container with
// the same hostname; it says its rules.
//
// Package vm never runs a shell on the host, and never passes a command
// through a shell inside the sandbox: argv reaches the program verbatim.
//
// # Reading the code
//
// The contract is written once, in one unexported type over a small
// driver interface (internal/driver) that only talks to an engine:
// internal/podman's api.go over the socket and cli.go through the podman
// command, and internal/kube's Pod per sandbox, which vm/kube registers
// (internal/driver/engine.go) so that vm never links client-go.
// The lifecycle is in lifecycle.go, a Run in run.go (through the agent:
// agent.go; the agent's binary reaches the sandbox by
// internal/agent/install.go, and its channel is a socket of this machine
// where it can be, channel.go), how a stopped Run is killed inside the
// sandbox in kill.go (through the agent, the run's shim kills its whole
// tree: internal/agent/server/shim_linux.go), the copies in copy.go (the
// agent's file operations, which serve the copies and the file calls of
// a sandbox with the agent, in files_agent.go and internal/agent/fsop),
// snapshots in snapshot.go (the commit: internal/podman/snapshot.go), and
// how Podman's errors are recognised, for both transports, in
// internal/podman/errors.go.
package vm
