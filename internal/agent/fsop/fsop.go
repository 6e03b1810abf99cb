package fsop

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Code is the exit code of an operation: what the host maps to an error.
type Code int

// The exit codes of [Main]. Those with a meaning start at 64, clear of
// the 2 that a Go program's fatal error or a bad flag exits with.
const (
	// CodeOK: the operation succeeded.
	CodeOK Code = 0
	// CodeFailed: any failure without a code of its own.
	CodeFailed Code = 1
	// CodeNotExist: the path, or one of its parents, does not exist.
	CodeNotExist Code = 64
	// CodeInvalid: the file is of the wrong kind (not a regular file,
	// where a directory has a code of its own) or an argument is bad.
	CodeInvalid Code = 65
	// CodeUnsafe: an entry would land outside the destination, or cannot
	// be carried faithfully (a socket in a tar, a device to create).
	CodeUnsafe Code = 66
	// CodeTooLarge: the file is over the caller's cap.
	CodeTooLarge Code = 67
	// CodeExist: something exists where it must not.
	CodeExist Code = 68
	// CodeIsDir: a directory where a file must be (EISDIR).
	CodeIsDir Code = 69
	// CodeNotDir: a file where a directory must be, the path's own or
	// one above it (ENOTDIR).
	CodeNotDir Code = 70
	// CodeNameTooLong: a name or the path is too long (ENAMETOOLONG).
	CodeNameTooLong Code = 71
	// CodePermission: the operation is not permitted (EACCES, EPERM).
	CodePermission Code = 72
	// CodeReadOnly: the filesystem is read-only (EROFS).
	CodeReadOnly Code = 73
	// CodeLoop: too many levels of symbolic links (ELOOP).
	CodeLoop Code = 74
	// CodeNoSpace: the filesystem, or the user's quota on it, is full
	// (ENOSPC, EDQUOT).
	CodeNoSpace Code = 75
)

// bufSize is the size of every copy buffer.
const bufSize = 256 << 10

// opError is a failure with the exit code it maps to; its message is the
// line Main writes to stderr.
type opError struct {
	code Code
	msg  string
}

func (e *opError) Error() string { return e.msg }

func failf(code Code, format string, args ...any) error {
	return &opError{code, fmt.Sprintf(format, args...)}
}

// Main runs one file operation, args being OP and its arguments, with the
// command's stdio, and returns the process exit code (see the Code
// constants). Every failure writes one line to stderr: the reason, without
// the path (e.g. "is a directory", "no such file or directory", "12345
// bytes, over the cap of 100", `entry "a/b": a symlink under the
// destination leads out of it`).
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := run(args, stdin, stdout)
	if err == nil {
		return int(CodeOK)
	}
	fmt.Fprintln(stderr, strings.ReplaceAll(err.Error(), "\n", `\n`))
	return int(codeOf(err))
}

// codeOf is the exit code of err: an opError's own, else its errno's.
func codeOf(err error) Code {
	var oe *opError
	if errors.As(err, &oe) {
		return oe.code
	}
	return errnoCode(err)
}

// run parses args and runs the operation they name.
func run(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return failf(CodeInvalid, "no operation")
	}
	op, args := args[0], args[1:]
	want, ok := map[string]int{"read": 2, "write": 3, "list": 1, "tar-out": 1, "tar-in": 1}[op]
	if !ok {
		return failf(CodeInvalid, "unknown operation %q", op)
	}
	if len(args) != want {
		return failf(CodeInvalid, "%s takes %d arguments, not %d", op, want, len(args))
	}
	path := args[0]
	if !strings.HasPrefix(path, "/") {
		return failf(CodeInvalid, "not an absolute path")
	}
	switch op {
	case "read":
		max, err := strconv.ParseInt(args[1], 10, 64)
		if err != nil || max < -1 {
			return failf(CodeInvalid, "bad cap %q", args[1])
		}
		return readFile(path, max, stdout)
	case "write":
		size, err := strconv.ParseInt(args[1], 10, 64)
		if err != nil || size < -1 {
			return failf(CodeInvalid, "bad size %q", args[1])
		}
		perm, err := strconv.ParseUint(args[2], 8, 32)
		if err != nil || perm > 0o7777 {
			return failf(CodeInvalid, "bad permissions %q", args[2])
		}
		return writeFile(path, size, uint32(perm), stdin)
	case "list":
		return listDir(path, stdout)
	case "tar-out":
		return tarOut(path, stdout)
	default:
		return tarIn(path, stdin)
	}
}
