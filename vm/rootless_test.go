package vm

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/exec/execmock"
	"github.com/podvm/podvm/internal/libpod/libpodtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/mock/gomock"
)

// rootlessInfo is `podman info --format json` of rootless Podman on a
// cgroup v1 host, as much of it as podvm reads: no controller.
const rootlessInfo = `{"host":{"cgroupVersion":"v1","cgroupControllers":[],"security":{"rootless":true}}}`

// refusals are configs rootless Podman on cgroup v1 cannot enforce, by
// the limit the error names; the default pids limit among them.
var refusals = map[string]Config{
	"pids":   {},
	"memory": {Pids: NoPidsLimit, Memory: 64 << 20},
	"CPU":    {Pids: NoPidsLimit, CPUs: 1},
}

// On rootless Podman without cgroup controllers, a limit is refused
// before anything is made, and NoPidsLimit asks for none.
func TestAPIRootlessLimits(t *testing.T) {
	t.Parallel()
	rootless := libpodtest.Routes{"GET /info": libpodtest.Recorded("info-rootless")}

	v, svc := fakeVM(t, "4.3", rootless, Config{Pids: NoPidsLimit})
	require.NoError(t, v.Create(context.Background()))
	var spec map[string]any
	require.NoError(t, json.Unmarshal(body(t, svc, "POST /containers/create"), &spec))
	assert.Equal(t, map[string]any{}, spec["resource_limits"], "no pids limit for Podman to ignore")

	for name, cfg := range refusals {
		v, svc := fakeVM(t, "4.3", rootless, cfg)
		err := v.Create(context.Background())
		require.ErrorIs(t, err, ErrNotSupported, name)
		assert.ErrorContains(t, err, "a "+name+" limit: rootless Podman on cgroup v1 cannot enforce it")
		if name == "pids" {
			assert.ErrorContains(t, err, "vm.NoPidsLimit", "the way out")
		}
		assert.Equal(t, []string{"GET /_ping", "GET /info"}, routes(svc), "%s: nothing asked after the info", name)
		assert.Empty(t, v.ID())
		assert.NoError(t, v.Remove(context.Background()))
	}

	// Rootful, no limit is asked for as such.
	v, svc = fakeVM(t, "4.3", nil, Config{Pids: NoPidsLimit})
	require.NoError(t, v.Create(context.Background()))
	require.NoError(t, json.Unmarshal(body(t, svc, "POST /containers/create"), &spec))
	assert.Equal(t, map[string]any{"pids": map[string]any{"limit": float64(-1)}}, spec["resource_limits"])
}

func TestCLIRootlessLimits(t *testing.T) {
	t.Parallel()
	rootless := func(t *testing.T, url string, cfg Config) (*CLIVM, *execmock.MockExecutor) {
		x := execmock.NewMockExecutor(gomock.NewController(t))
		x.EXPECT().Run(gomock.Any(), isInfo).Return(&exec.Result{Stdout: rootlessInfo}, nil).AnyTimes()
		cfg.Image, cfg.PodmanExec = "img", true
		v, err := NewCLIVM(cfg, x, WithURL(url)) // a URL of its own: what a service enforces is kept by service
		require.NoError(t, err)
		return v, x
	}

	v, x := rootless(t, "tcp://rootless.example:1", Config{Pids: NoPidsLimit})
	gomock.InOrder(
		x.EXPECT().Run(gomock.Any(), gomock.Any()).Return(&exec.Result{Stdout: "amd64\n"}, nil),
		x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, c exec.Command) (*exec.Result, error) {
			assert.Equal(t, []string{"run", "-d"}, c.Args[2:4])
			assert.NotContains(t, c.Args, "--pids-limit")
			return &exec.Result{Stdout: testID + "\n"}, nil
		}),
	)
	require.NoError(t, v.Create(context.Background()))

	for name, cfg := range refusals {
		v, _ := rootless(t, "tcp://rootless.example:2", cfg) // no call but the info
		err := v.Create(context.Background())
		require.ErrorIs(t, err, ErrNotSupported, name)
		assert.ErrorContains(t, err, "a "+name+" limit")
	}
}

// What a service enforces is asked again once it could not be reached:
// it may have come back rootless.
func TestHostForgottenWhenUnavailable(t *testing.T) {
	t.Parallel()
	svc := libpodtest.Serve(t, "4.3", libpodtest.Routes{
		"GET /info":               libpodtest.Seq(libpodtest.Recorded("info"), libpodtest.Recorded("info-rootless")),
		"POST /containers/create": libpodtest.Cut("container-create", 0),
	})
	newVM := func() *APIVM {
		v, err := NewAPIVM(context.Background(), svc.URI, Config{Image: testImage, PodmanExec: true})
		require.NoError(t, err)
		return v
	}
	v := newVM()
	require.ErrorIs(t, v.Create(context.Background()), ErrUnavailable)
	_ = v.Remove(context.Background())

	err := newVM().Create(context.Background())
	require.ErrorIs(t, err, ErrNotSupported, "the rootless service's answer, not the cached rootful one")
	assert.ErrorContains(t, err, "a pids limit")
}
