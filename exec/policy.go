package exec

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"strings"
)

// Policy is a set of capabilities. A command runs only if a grant allows
// its Name and, when Dirs is non-nil, its Dir lies within an allowed
// directory.
type Policy struct {
	// Grants allow commands. "exec" allows any command; "exec:PATTERN"
	// allows commands whose Name matches PATTERN with [path.Match]
	// semantics, compared with Name exactly as given: "exec:go" allows
	// Name "go" (looked up in PATH) but not "/tmp/go", and
	// "exec:/usr/bin/*" allows any program directly in /usr/bin. An empty
	// Grants allows nothing.
	Grants []string
	// Dirs, if non-nil, lists the absolute directories a command may run
	// in, each with everything below it. An empty Command.Dir (the
	// executor's default directory) is always allowed. If nil, any Dir is
	// allowed.
	Dirs []string
}

// Check reports whether p allows cmd, returning an error matching
// [ErrNotAllowed] that says why when it does not. Malformed grants never
// match and are named in the error.
func (p Policy) Check(cmd Command) error {
	if err := p.checkName(cmd.Name); err != nil {
		return err
	}
	return p.checkDir(cmd.Dir)
}

func (p Policy) checkName(name string) error {
	var bad []string
	for _, g := range p.Grants {
		if g == "exec" {
			return nil
		}
		pattern, ok := strings.CutPrefix(g, "exec:")
		if !ok || pattern == "" {
			bad = append(bad, g)
			continue
		}
		match, err := path.Match(pattern, name)
		if err != nil {
			bad = append(bad, g)
			continue
		}
		if match {
			return nil
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: command %q (malformed grants ignored: %q)", ErrNotAllowed, name, bad)
	}
	return fmt.Errorf("%w: command %q", ErrNotAllowed, name)
}

func (p Policy) checkDir(dir string) error {
	if p.Dirs == nil || dir == "" {
		return nil
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%w: relative working directory %q", ErrNotAllowed, dir)
	}
	dir = filepath.Clean(dir)
	for _, allowed := range p.Dirs {
		if !filepath.IsAbs(allowed) {
			continue
		}
		rel, err := filepath.Rel(filepath.Clean(allowed), dir)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return nil
		}
	}
	return fmt.Errorf("%w: working directory %q", ErrNotAllowed, dir)
}

// Restricted is an [Executor] that runs only what its [Policy] allows.
type Restricted struct {
	inner  Executor
	policy Policy
}

var _ Executor = (*Restricted)(nil)

// Restrict returns an Executor that checks every command against p and
// passes the allowed ones to inner, which may be any Executor: the host,
// a sandbox, or another Restricted. The policy is copied.
func Restrict(inner Executor, p Policy) *Restricted {
	p.Grants = append([]string(nil), p.Grants...)
	if p.Dirs != nil {
		p.Dirs = append([]string{}, p.Dirs...)
	}
	return &Restricted{inner: inner, policy: p}
}

// Run validates cmd, checks it against the policy and, only if it is
// allowed, runs it with the inner Executor. A refused command runs
// nothing and returns an error matching [ErrNotAllowed].
func (r *Restricted) Run(ctx context.Context, cmd Command) (*Result, error) {
	if err := cmd.Validate(); err != nil {
		return nil, err
	}
	if err := r.policy.Check(cmd); err != nil {
		return nil, err
	}
	return r.inner.Run(ctx, cmd)
}
