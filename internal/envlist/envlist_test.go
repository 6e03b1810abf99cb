package envlist

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMerge(t *testing.T) {
	for _, c := range []struct {
		name             string
		base, over, want []string
	}{
		{"no over is base", []string{"A=1", "A=2"}, nil, []string{"A=1", "A=2"}},
		{"over replaces in place", []string{"A=1", "B=2"}, []string{"A=3"}, []string{"A=3", "B=2"}},
		{"new keys after", []string{"A=1"}, []string{"C=3", "B=2"}, []string{"A=1", "C=3", "B=2"}},
		{"last duplicate of over wins", nil, []string{"A=1", "A=2"}, []string{"A=2"}},
		{"duplicates of base collapse", []string{"A=1", "A=2"}, []string{"B=1"}, []string{"A=2", "B=1"}},
		{"empty value and no =", []string{"A="}, []string{"A", "B="}, []string{"A", "B="}},
	} {
		base := append([]string(nil), c.base...)
		over := append([]string(nil), c.over...)
		assert.Equal(t, c.want, Merge(base, over), c.name)
		assert.Equal(t, c.base, base, "%s: base modified", c.name)
		assert.Equal(t, c.over, over, "%s: over modified", c.name)
	}
}

func TestLookup(t *testing.T) {
	env := []string{"PATH=/bin", "HOME=/root", "PATH=/usr/bin", "EMPTY="}
	for _, c := range []struct {
		key, want string
		found     bool
	}{{"PATH", "/usr/bin", true}, {"HOME", "/root", true}, {"EMPTY", "", true}, {"NOPE", "", false}, {"PAT", "", false}} {
		v, ok := Lookup(env, c.key)
		assert.Equal(t, c.want, v, c.key)
		assert.Equal(t, c.found, ok, c.key)
	}
}
