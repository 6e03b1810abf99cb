package podman

import (
	"strings"
	"unicode/utf8"
)

// Podman reads a container path in a copy as a glob, not as a name. The
// path Podman 4.3 gets from the archive endpoint's HEAD and GET and from
// `podman cp CTR:PATH` goes to buildah's copier (Stat, Get), which runs
// it through filepath.Glob (vendor/github.com/containers/buildah/copier/
// copier.go, copierHandlerStat and copierHandlerGet); with files x and
// [x], "[x]" reads x. Before that, libpod's stat
// (libpod/container_stat_common.go, driver.Container.stat) answers "no such
// file" to any path holding a '*', escaped or not. PUT, and the put half
// of `podman cp -`, take the directory as it is (copier.Put,
// libpod/container_copy_common.go, copyFromArchive), creating what is
// missing. So a path read goes to Podman as a pattern that matches it
// alone ([globLiteral]); a path written, as itself.

// globMeta are the bytes filepath.Match gives a meaning.
const globMeta = `*?[]\`

// hasGlobMeta reports whether Podman would read p as a pattern, or p is
// not UTF-8 (which a pattern cannot tell apart byte by byte once Podman's
// JSON has replaced the bytes, see [globLiteral]).
func hasGlobMeta(p string) bool {
	return strings.ContainsAny(p, globMeta) || !utf8.ValidString(p)
}

// Classes of filepath.Match that each match exactly one rune and hold no
// '*': Podman refuses any path holding one, escaped or not.
const (
	// starClass matches '*' (0x2A) alone: every rune but those below
	// and above it. A NUL is never in a path.
	starClass = "[^\x01-)+-\U0010FFFF]"
	// badByteClass matches one byte that is not UTF-8 (filepath.Match
	// decodes it as U+FFFD) or U+FFFD itself, and nothing else.
	badByteClass = "[^\x01-\uFFFC\uFFFE-\U0010FFFF]"
)

// globLiteral returns p as a pattern of filepath.Match that matches p
// alone: '?', '[', ']' and '\' escaped with a backslash, '*' as
// [starClass]. Bytes that are not UTF-8 stay as they are (a pattern
// compares them byte by byte), unless ambiguousBytes, when each becomes
// [badByteClass]: for podman-remote, whose `podman cp` sends back the
// path it stat'ed through JSON, which turns such bytes into U+FFFD. Such
// a pattern also matches a name with other bad bytes at those places;
// the caller tells them apart.
func globLiteral(p string, ambiguousBytes bool) string {
	var b strings.Builder
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRuneInString(p[i:])
		switch {
		case r == utf8.RuneError && n == 1 && ambiguousBytes:
			b.WriteString(badByteClass)
		case r == '*':
			b.WriteString(starClass)
		case strings.ContainsRune(globMeta, r):
			b.WriteByte('\\')
			b.WriteRune(r)
		default:
			b.WriteString(p[i : i+n])
		}
		i += n
	}
	return b.String()
}

// literalParent splits directory dir at its deepest ancestor that Podman
// reads as itself (see [hasGlobMeta]): dir is base joined with rest, and
// rest is "" when dir is read as itself.
func literalParent(dir string) (base, rest string) {
	base = dir
	for hasGlobMeta(base) {
		i := strings.LastIndexByte(base, '/')
		rest = base[i+1:] + "/" + rest
		base = base[:i]
	}
	if base == "" {
		base = "/"
	}
	return base, strings.TrimSuffix(rest, "/")
}
