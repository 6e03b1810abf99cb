// Package envlist works on environments as lists of KEY=VALUE entries,
// the form exec and podvm's agent hand to a new process: one merge rule
// for the host and the sandbox.
package envlist

import "strings"

// Merge returns base with the entries of over added; an entry of over
// replaces every entry of base with the same key, and the last of
// duplicates within over wins. Order: base's surviving keys first, in
// their order, then over's new keys. Neither input is modified; with no
// over, base itself is returned.
func Merge(base, over []string) []string {
	if len(over) == 0 {
		return base
	}
	pos := make(map[string]int, len(base)+len(over))
	out := make([]string, 0, len(base)+len(over))
	for _, list := range [][]string{base, over} {
		for _, e := range list {
			k, _, _ := strings.Cut(e, "=")
			if i, ok := pos[k]; ok {
				out[i] = e
				continue
			}
			pos[k] = len(out)
			out = append(out, e)
		}
	}
	return out
}

// Lookup returns the value of key in env, the last entry's where there
// are several, and whether there is one.
func Lookup(env []string, key string) (string, bool) {
	v, found := "", false
	for _, e := range env {
		if k, val, _ := strings.Cut(e, "="); k == key {
			v, found = val, true
		}
	}
	return v, found
}
