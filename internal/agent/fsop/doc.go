// Package fsop is the agent's file service: the file operations podvm
// runs inside a sandbox as an ordinary command of the sandbox,
//
//	/.podvm/podvm-agent -fs OP ARGS...
//
// with the operation's data on stdin and stdout, its failure as one line
// on stderr and an exit code the host maps to an error ([Code]). The
// agent binary does the work itself, so names are bytes (any byte but
// NUL; glob characters and newlines are ordinary characters), sockets are
// reported rather than dropped, and nothing written beneath a destination
// follows a symlink that code in the sandbox planted out of it.
//
// Paths are absolute paths in the sandbox. The operations:
//
//	read PATH MAX          the content of regular file PATH on stdout
//	write PATH SIZE PERM   stdin becomes file PATH
//	list DIR               DIR's entries on stdout, for [DecodeList]
//	tar-out PATH           PATH as a tar stream on stdout
//	tar-in DIR             the tar stream on stdin extracted beneath DIR
//
// read follows symlinks in PATH (never a magic link such as
// /proc/self/fd/N where the kernel has openat2), refuses a directory or
// any other file that is not regular without opening it for reading, and
// refuses a file over MAX bytes (-1: no cap) before writing anything; a
// file that grows past MAX while it is read delivers MAX bytes and fails
// ([CodeTooLarge]).
//
// write takes exactly SIZE bytes (-1: all of stdin) and gives the file
// exactly mode PERM (octal, setuid, setgid and sticky included) whatever
// the umask and whether or not it existed. An existing regular file is
// truncated and rewritten in place (as os.WriteFile does, so a
// bind-mounted file such as /etc/hosts can be written); a symlink or any
// other file that is not regular is removed first, never followed. When
// stdin does not carry SIZE bytes the file keeps what came.
//
// list writes entries sorted by name, each with its size (regular files),
// mode, modification time (to the nanosecond) and symlink target, names
// and targets as raw bytes; the names of a directory are in memory once.
//
// tar-out writes what `tar -C dirname(PATH) -c basename(PATH)` would, in
// GNU format (names and link targets of any bytes and any length; mtimes
// to the second): PATH itself is followed if it is a symlink, nothing
// beneath it is, other mounts are crossed. Hard links within the tree
// become links to the first name seen; FIFOs and devices are carried as
// their tar types; a socket fails the operation ([CodeUnsafe]) naming it. A
// regular file that changes size while it is read still gets exactly the
// size of its header (cut, or padded with zeros), and the operation goes
// on and fails at the end ([CodeFailed]) naming the first such file.
//
// tar-in extracts beneath DIR (itself reached through any symlinks). Each
// entry's parent is resolved with openat2(RESOLVE_BENEATH|
// RESOLVE_NO_MAGICLINKS) from a descriptor of DIR, so a symlink under DIR
// may lead elsewhere under DIR but never out of it: such an entry fails
// ([CodeUnsafe]) naming it, as do absolute names and names with "..". Where the
// kernel lacks openat2 (before Linux 5.6) parents are walked one
// component at a time and any symlink among them is refused. Existing
// files are removed and created again, never opened; directories are
// merged; missing parents are created (the umask applies to those);
// devices are refused ([CodeUnsafe]); a PAX global header is skipped. Modes are
// applied exactly, mtimes too (directories' after their contents, at the
// end); ownership stays the process's. stdin is read to its end. The
// first failing entry ends the extraction: what came before it stays, its
// directories still mode 0700.
//
// Every operation streams with 256 KiB buffers: no file, listing of
// entries or archive is held in memory whole.
package fsop
