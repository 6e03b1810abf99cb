package exec_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/mock/gomock"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/exec/execmock"
)

func TestRestrict(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		what    string
		policy  exec.Policy
		cmd     exec.Command
		allowed bool
	}{
		{"no grants allow nothing", exec.Policy{}, exec.Command{Name: "ls"}, false},
		{"exec allows anything", exec.Policy{Grants: []string{"exec"}}, exec.Command{Name: "/bin/rm"}, true},
		{"glob on the name", exec.Policy{Grants: []string{"exec:go*"}}, exec.Command{Name: "gofmt"}, true},
		{"exact name", exec.Policy{Grants: []string{"exec:go"}}, exec.Command{Name: "go"}, true},
		{"a path is not the bare name", exec.Policy{Grants: []string{"exec:go"}}, exec.Command{Name: "/tmp/go"}, false},
		{"directory glob", exec.Policy{Grants: []string{"exec:/usr/bin/*"}}, exec.Command{Name: "/usr/bin/env"}, true},
		{"glob does not cross /", exec.Policy{Grants: []string{"exec:/usr/*"}}, exec.Command{Name: "/usr/bin/env"}, false},
		{"other capability ignored", exec.Policy{Grants: []string{"net", "execute"}}, exec.Command{Name: "ls"}, false},
		{"malformed glob never matches", exec.Policy{Grants: []string{"exec:["}}, exec.Command{Name: "["}, false},
		{"dir inside an allowed dir", exec.Policy{Grants: []string{"exec"}, Dirs: []string{"/work"}}, exec.Command{Name: "ls", Dir: "/work/a/b"}, true},
		{"the allowed dir itself", exec.Policy{Grants: []string{"exec"}, Dirs: []string{"/work/"}}, exec.Command{Name: "ls", Dir: "/work"}, true},
		{"dir outside", exec.Policy{Grants: []string{"exec"}, Dirs: []string{"/work"}}, exec.Command{Name: "ls", Dir: "/workshop"}, false},
		{"dir escaping with ..", exec.Policy{Grants: []string{"exec"}, Dirs: []string{"/work"}}, exec.Command{Name: "ls", Dir: "/work/../etc"}, false},
		{"relative dir", exec.Policy{Grants: []string{"exec"}, Dirs: []string{"/work"}}, exec.Command{Name: "ls", Dir: "work"}, false},
		{"default dir always allowed", exec.Policy{Grants: []string{"exec"}, Dirs: []string{}}, exec.Command{Name: "ls"}, true},
		{"empty non-nil Dirs allows no explicit dir", exec.Policy{Grants: []string{"exec"}, Dirs: []string{}}, exec.Command{Name: "ls", Dir: "/"}, false},
	} {
		t.Run(tc.what, func(t *testing.T) {
			ctrl := gomock.NewController(t)
			inner := execmock.NewMockExecutor(ctrl)
			want := &exec.Result{Stdout: "ran"}
			if tc.allowed {
				inner.EXPECT().Run(gomock.Any(), tc.cmd).Return(want, nil)
			} // otherwise gomock fails the test on any call: nothing may run
			res, err := exec.Restrict(inner, tc.policy).Run(context.Background(), tc.cmd)
			if tc.allowed {
				require.NoError(t, err)
				assert.Same(t, want, res)
				return
			}
			require.ErrorIs(t, err, exec.ErrNotAllowed)
			assert.Nil(t, res)
		})
	}
}

func TestRestrictValidatesFirst(t *testing.T) {
	t.Parallel()
	inner := execmock.NewMockExecutor(gomock.NewController(t))
	_, err := exec.Restrict(inner, exec.Policy{Grants: []string{"exec"}}).Run(context.Background(), exec.Command{Name: "a\x00"})
	require.ErrorIs(t, err, exec.ErrInvalidCommand)
}

func TestRestrictCopiesPolicy(t *testing.T) {
	t.Parallel()
	grants := []string{"exec:ls"}
	inner := execmock.NewMockExecutor(gomock.NewController(t))
	r := exec.Restrict(inner, exec.Policy{Grants: grants})
	grants[0] = "exec"
	_, err := r.Run(context.Background(), exec.Command{Name: "rm"})
	require.ErrorIs(t, err, exec.ErrNotAllowed, "changing the caller's slice must not widen the policy")
}

func TestRestrictOnHost(t *testing.T) {
	t.Parallel()
	r := exec.Restrict(exec.NewCommandExecutor(), exec.Policy{Grants: []string{"exec:echo"}})
	res, err := r.Run(context.Background(), exec.Command{Name: "echo", Args: []string{"ok"}})
	require.NoError(t, err)
	assert.Equal(t, "ok\n", res.Stdout)
	_, err = r.Run(context.Background(), exec.Command{Name: "touch", Args: []string{t.TempDir() + "/x"}})
	require.ErrorIs(t, err, exec.ErrNotAllowed)
	assert.NoFileExists(t, t.TempDir()+"/x")
}
