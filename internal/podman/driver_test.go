package podman

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/mock/gomock"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/exec/execmock"
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/libpod/libpodtest"
	"github.com/podvm/podvm/internal/podmantest"
)

// apiOn returns the API driver on a fake service answering routes.
func apiOn(t *testing.T, routes libpodtest.Routes) (API, *libpodtest.Service) {
	t.Helper()
	svc := libpodtest.Serve(t, "4.3", routes)
	c, err := libpod.Connect(context.Background(), svc.URI)
	require.NoError(t, err)
	return NewAPI(c), svc
}

func count(svc *libpodtest.Service, route string) int {
	n := 0
	for _, r := range svc.Requests() {
		if r.Route == route {
			n++
		}
	}
	return n
}

// A container that exits by itself while it is force-removed is removed
// still (podman#16142): Podman's refusal is retried a few times, then
// reported. Each transport, from the answers Podman 4.3 gave.
func TestRemoveStoppedMeanwhile(t *testing.T) {
	t.Parallel()
	const route = "DELETE /containers/{id}"
	id := strings.Repeat("c", 64)
	refused, removed := libpodtest.Recorded("container-remove-stopped-meanwhile"), libpodtest.Recorded("container-remove")

	t.Run("api", func(t *testing.T) {
		t.Parallel()
		d, svc := apiOn(t, libpodtest.Routes{route: libpodtest.Seq(refused, refused, removed)})
		require.NoError(t, d.Remove(context.Background(), id))
		assert.Equal(t, 3, count(svc, route))

		d, svc = apiOn(t, libpodtest.Routes{route: refused})
		err := d.Remove(context.Background(), id)
		assert.ErrorIs(t, err, ErrContainerNotRunning)
		assert.Equal(t, 4, count(svc, route), "tried a bounded number of times")
	})
	t.Run("cli", func(t *testing.T) {
		t.Parallel()
		for _, sample := range []string{"rm-stopped-meanwhile-loc.2.txt", "rm-stopped-meanwhile-remote.2.txt"} {
			x := execmock.NewMockExecutor(gomock.NewController(t))
			d, err := NewCLI(x, "podman", "", "")
			require.NoError(t, err)
			rm := func(_ context.Context, c exec.Command) (*exec.Result, error) {
				assert.Equal(t, []string{"rm", "-f", "-t", "0", "--ignore", id}, c.Args)
				return podmantest.Sample(t, sample), nil
			}
			gomock.InOrder(
				x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(rm),
				x.EXPECT().Run(gomock.Any(), gomock.Any()).Return(&exec.Result{Stdout: id + "\n"}, nil),
			)
			require.NoError(t, d.Remove(context.Background(), id), sample)

			x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(rm).Times(4)
			err = d.Remove(context.Background(), id)
			assert.ErrorIs(t, err, ErrContainerNotRunning, sample)
			var cerr *CLIError
			assert.ErrorAs(t, err, &cerr)
		}
	})
}
