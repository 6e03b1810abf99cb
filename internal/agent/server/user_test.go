package server

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLookupUser(t *testing.T) {
	t.Parallel()
	passwd := []byte("# comment\nroot:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nbroken:x:zz:1::/:/bin/sh\n")
	group := []byte("root:x:0:\nalice:x:1000:\nwheel:x:10:alice,bob\ndocker:x:999:bob,alice\n")
	tests := []struct {
		spec    string
		want    ident
		wantErr bool
	}{
		{spec: "root", want: ident{uid: 0, gid: 0, groups: []uint32{0}, home: "/root"}},
		{spec: "alice", want: ident{uid: 1000, gid: 1000, groups: []uint32{1000, 10, 999}, home: "/home/alice"}},
		{spec: "1000", want: ident{uid: 1000, gid: 1000, groups: []uint32{1000, 10, 999}, home: "/home/alice"}},
		{spec: "4242", want: ident{uid: 4242, gid: 0, groups: []uint32{0}}},
		{spec: "4242:77", want: ident{uid: 4242, gid: 77, groups: []uint32{77}}},
		{spec: "alice:wheel", want: ident{uid: 1000, gid: 10, groups: []uint32{10, 999}, home: "/home/alice"}},
		{spec: "alice:5", want: ident{uid: 1000, gid: 5, groups: []uint32{5, 10, 999}, home: "/home/alice"}},
		{spec: "nobody", wantErr: true},
		{spec: "broken", wantErr: true},
		{spec: "alice:nogroup", wantErr: true},
		{spec: ":0", wantErr: true},
		{spec: "0:", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			t.Parallel()
			got, err := lookupUser(tt.spec, passwd, group)
			if tt.wantErr {
				require.ErrorIs(t, err, errUnknownUser)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}
