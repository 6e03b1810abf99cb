// Package agent is podvm's sandbox agent: the program that runs as PID 1
// of every sandbox (package server, command cmd/podvm-agent), the host
// side [Client] that runs commands through it over one stream, and the
// agent binaries themselves, embedded for linux/amd64 and linux/arm64
// ([Binary], [Digest]; rebuilt byte for byte by `make generate`).
//
// A run is a message on a stream that is already open, not a new exec
// session, and the agent keeps track of every process a run starts. It
// never runs a shell: Request.Argv is executed as given.
//
// # Frames
//
// Both directions carry frames: a 9-byte header — type (1 byte), run id
// (uint32, big endian), payload length (uint32, big endian, at most
// 4 MiB) — then the payload. Strings in payloads are a uint32 length and
// the raw bytes (any byte but NUL, no UTF-8 check); lists are a uint32
// count and their strings. The agent speaks first:
//
//	Hello    a→c  id 0   version, pid, uid, gid, GOARCH, Go release, working dir
//	Start    c→a  id n   argv, env, dir, user, and a terminal's rows and cols: run n begins
//	Started  a→c  id n   the command's pid: it runs (before any Exit of n)
//	Signal   c→a  id n   a signal for the command's process group, while it lives
//	Dial     c→a  id n   network, address, wait: run n is a connection the agent makes
//	Resize   c→a  id n   rows, cols of run n's terminal (a Start with TTY set)
//	Stdin    c→a  id n   bytes for the command; an empty payload is EOF
//	Stdout   a→c  id n   bytes the command wrote
//	Stderr   a→c  id n   bytes the command wrote
//	Credit   both id n   stream (0 stdin, 1 stdout, 2 stderr), bytes granted
//	Kill     c→a  id n   kill every process of run n
//	Exit     a→c  id n   status, code, killed, leftovers, usage, message: run n's last frame
//	Shutdown c→a  id 0   kill every run, then say Bye and exit
//	Bye      a→c  id 0   whether every process is dead
//	Listen   c→a  id 0   a key: serve more channels on a TCP port (see Peers)
//	Listening a→c id 0   the port, or why not
//	Freeze   c→a  id 0   send nothing more on this channel until Thaw
//	Frozen   a→c  id 0   the last frame before Thaw
//	Thaw     c→a  id 0   go on
//	Resume   c→a  id 0   go on, on the stream this came on: Hello first; a copy's: fresh, the runs it keeps
//
// Freeze stops a channel at a frame boundary, empty both ways, for a
// checkpoint ([Client.Freeze]): the client sends nothing from its Freeze
// to its Thaw, and the agent, once its sends in flight are written,
// nothing from its Frozen on; runs go on, their output waiting in their
// pipes. A frozen agent takes nothing but Thaw or Resume: any other frame
// is a protocol error, and a channel that ends while frozen ends as any
// other. Where a checkpoint stops the sandbox, its stream ends with it
// ([Client.Detach]); restored, the agent reads the same descriptors, now
// a new stream's, and the client comes back on that stream with Resume
// ([Client.Rebind]): the agent says Hello again, then sends what it held
// back, and every run, held process and handle goes on. A copy restored
// from a checkpoint holds the same frozen agent with the original's
// runs; its new client resumes it with a fresh Resume naming the runs it
// adopts ([ResumeCopy]), whose windows start full again. The agent kills
// the others, and nothing of theirs is sent: the copy's client never
// knew them.
//
// The client picks run ids; Started, Stdout and Stderr of a run all come
// before its Exit (a start failure has no Started). [Client.Run] waits
// for the Exit; [Client.Start] returns at Started, with a [Proc] that
// signals, kills and waits for the run. A frame of an unknown type, or an Exit/data frame for a run the
// client does not know, is a protocol error that ends the channel.
//
// # Flow control
//
// Each stream of each run has a window of 1 MiB: a sender has at most
// that many unacknowledged bytes in flight, in chunks of at most 128 KiB,
// and the receiver grants Credit as its consumer takes them, a quarter
// window at a time (the client after the caller's Writer returned, the
// agent after the command's stdin pipe took them): a short output costs
// no Credit frame. So the client's demultiplexer never blocks: it only
// appends to a buffer the window bounds, and one goroutine per stream
// writes to the caller's Writer. A slow Writer stalls its own stream and
// nothing else; the agent stops reading that pipe, and the command blocks
// in write as it would on a pipe.
//
// # Terminals
//
// A Start with TTY set runs its command on a pseudo-terminal the agent
// opens in the sandbox (/dev/ptmx): the shim gives the command the slave
// as stdin, stdout and stderr and as its controlling terminal, in a
// session of its own; the agent keeps the master, whose output is the
// run's Stdout and into which Stdin frames are typed. The kernel's line
// discipline does the rest (echo, ^C to the foreground job). Resize sets
// the master's window size.
//
// # Connections
//
// A Dial is a run whose "command" is a connection the agent makes in the
// sandbox's network namespace (TCP or a unix socket, whatever the
// sandbox's Network: loopback is always there): Started once it is made,
// Stdin frames written to it, Stdout frames read from it, in the same
// windows, and Exit when the sandbox's side closes it or a Kill closes
// it; a failed connect is an Exit of status DialFailed with the errno.
// A connection that failed once made (reset) ends with an Exit of
// status Exited whose Code is the errno of the read that failed (0: it
// was closed), so that the client's reader gets the failure, not EOF.
// With wait set the agent tries again every 10 ms while nothing listens.
// So a service in a sandbox with no network is reached from the caller's
// process, on a remote service or a cluster alike, by whoever holds the
// channel and nobody else.
//
// # Who runs what
//
// The agent (PID 1) owns the channel and routes frames; it starts no
// command itself. Each run in flight has a shim: the agent binary re-run
// with -shim, a child subreaper (PR_SET_CHILD_SUBREAPER), so every
// process the command starts — in a new session, double-forked, with a
// cleared environment, renamed, under another uid, non-dumpable — stays
// its descendant. The agent hands the shim the request and the run's
// three pipe ends over a socketpair (SCM_RIGHTS); the shim resolves the
// user from /etc/passwd and /etc/group, merges the environment over its
// own (the container's), looks the command up in the merged PATH, starts
// it in a process group of its own and reaps every process of the run
// itself, adding up the kernel's usage of each (CPU time; the peak RSS is
// the largest process's). Shims are reused: one whose run ended with
// nothing left alive returns to a pool (up to 32 idle, as many as runs
// were in flight at once; one unused for 30 s exits), and one spare is
// started ahead of need, so a run costs no process start of the agent
// binary (that costs ~2.7 ms; a round trip of /bin/true is ~1.3 ms p50
// here, host os/exec ~0.8 ms). A new shim says Hello on its socket once
// it is ready to serve.
//
// # The kill rule
//
// When the command exits, whatever it left running is killed: the run
// is over and nothing of it outlives Run (the host executor does the
// same; Exit.Leftovers counts them). A Kill (the caller's context ended),
// a Shutdown, or the end of the stdio channel kills the run's whole tree.
// Killing walks the shim's descendants through /proc/PID/task/*/children,
// sends SIGKILL to each (a process with SIGKILL pending forks no more),
// reaps, and walks again until the shim has no child at all, so fork
// bombs at the pids limit are emptied too. Exit reports what could not be
// killed; the client turns that into [ErrNotKilled].
//
// # What the agent guarantees, and what it cannot
//
// The agent and its shims are not dumpable, so a process in the sandbox,
// root included, without CAP_SYS_PTRACE (Podman does not grant it) can
// neither ptrace them, read their memory or /proc/PID/environ, open their
// fds through /proc/PID/fd (it can list the fd numbers) nor take them with
// pidfd_getfd: it cannot read, inject into or forge the channel. The
// channel's fds are moved away from 0, 1 and 2 (which get /dev/null) and
// are close-on-exec, so no command inherits them. The agent catches and
// drops every catchable signal, so nothing inside the sandbox can kill PID
// 1 with kill(2) (and SIGKILL from inside never reaches PID 1).
//
// A fork bomb that holds every pid of the sandbox's limit (threads count
// there) does not kill the agent or a shim, though a Go program dies
// when it cannot make a thread its runtime wants: they make every thread
// they will need before they serve (at least 14 for the agent, 8 for a
// shim; see server.AgentThreads), and never need another. At the limit a
// run that cannot start fails with its start error, and so does one
// whose new shim could not make its threads (it exits before its Hello).
//
// It cannot stop a root process in the sandbox from killing a shim: the
// shim's run then ends with [ErrLost], and the agent kills every process
// that reached PID 1 (while shims are alive nothing legitimate is
// reparented to PID 1 — but a `podman exec` process left running in the
// sandbox is killed then too). Nor can it stop such a process from
// crashing the agent with a synchronous signal (SIGSEGV, SIGBUS, SIGFPE)
// sent with sigqueue(3), which the Go runtime treats as a fault: the
// sandbox then stops and every run fails with [ErrChannelClosed]. A run's
// output pipe handed to a process of another run stays open until that
// run ends; the agent waits 2 s for such a pipe to drain, then drops it.
//
// # The unix socket
//
// With -connect PATH the channel is a connection the agent makes, as it
// starts, to a socket the host listens on (in a host directory made for
// this sandbox alone, bind-mounted read-only): the sandbox can make
// nothing there, and the host removes the socket once the agent is
// connected, so nothing else can reach it. Like the stdio channel it is
// single-use: when it ends, the agent kills everything and exits. The
// stdio channel (Podman closes the container's stdin when its first
// attached client leaves) is used where no directory of the host reaches
// the sandbox.
//
// # Peers
//
// A Listen makes the agent listen on a TCP port of the sandbox's network
// (any address; the port the Listen names, PeerPort where package vm
// asks, or one the kernel picks) for more channels: a connection
// there is served only once it proved it holds the Listen's key (package
// psk: a mutual proof, then every record sealed), and is then a session
// of its own, from the agent's Hello on, with its own run ids ([DialPeer]).
// Its end kills its runs and nothing else; the first channel's end still
// ends the agent. The key travels only on the first channel, which is
// private already, and lives in the agent's memory, which nothing in the
// sandbox can read: a process there can connect to the port, but not get
// past the handshake. At most 8 handshakes are under way at once (each
// bounded by 10 s) and 64 peers served; the agent listens once. This is
// how a caller that can reach a pod's address skips the API server's
// attach stream.
//
// # Files
//
// `podvm-agent -fs OP ARGS` is a file operation of package fsop, run in
// the sandbox as an ordinary command (a run like any other, its data on
// the run's stdin and stdout): read, write, list, tar-out and tar-in,
// every path resolved inside the sandbox, beneath the destination for
// what it makes.
package agent
