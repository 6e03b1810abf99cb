package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// errUnknownUser reports a user or group that the container's
// /etc/passwd or /etc/group does not name.
var errUnknownUser = errors.New("unknown user")

// ident is who a run's command runs as.
type ident struct {
	uid, gid uint32
	groups   []uint32 // supplementary groups, the primary group first
	home     string   // from /etc/passwd; empty when the uid has no entry
}

// lookupUser resolves spec ("name", "uid", "name:group", "uid:gid", or a
// mix) with the contents of /etc/passwd and /etc/group, as a container
// runtime does: a numeric uid need not exist (its group is then 0 and it
// has no supplementary groups); a name must.
func lookupUser(spec string, passwd, group []byte) (ident, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return ident{}, fmt.Errorf("%w: %q", errUnknownUser, spec)
	}
	var id ident
	var name string
	uid, numeric := parseID(userPart)
	found := false
	for _, f := range records(passwd, 7) {
		if (numeric && f[2] == userPart) || (!numeric && f[0] == userPart) {
			u, ok1 := parseID(f[2])
			g, ok2 := parseID(f[3])
			if !ok1 || !ok2 {
				continue
			}
			id, name, found = ident{uid: u, gid: g, home: f[5]}, f[0], true
			break
		}
	}
	if !found {
		if !numeric {
			return ident{}, fmt.Errorf("%w: no user %q in /etc/passwd", errUnknownUser, userPart)
		}
		id = ident{uid: uid}
	}
	if hasGroup {
		gid, ok := parseID(groupPart)
		if !ok {
			ok = false
			for _, f := range records(group, 4) {
				if f[0] == groupPart {
					gid, ok = parseID(f[2])
					break
				}
			}
			if !ok {
				return ident{}, fmt.Errorf("%w: no group %q in /etc/group", errUnknownUser, groupPart)
			}
		}
		id.gid = gid
	}
	id.groups = []uint32{id.gid}
	if name != "" {
		for _, f := range records(group, 4) {
			g, ok := parseID(f[2])
			if ok && slices.Contains(strings.Split(f[3], ","), name) && !slices.Contains(id.groups, g) {
				id.groups = append(id.groups, g)
			}
		}
	}
	return id, nil
}

func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

// records splits a colon-separated database into its lines' fields,
// skipping comments and lines with fewer than n fields.
func records(data []byte, n int) [][]string {
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if f := strings.Split(line, ":"); len(f) >= n {
			out = append(out, f)
		}
	}
	return out
}
