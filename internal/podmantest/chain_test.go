package podmantest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
)

// TestChain proves what every vm test stands on: the service named by
// CONTAINER_HOST answers, and a container from the test image runs a
// command through it.
func TestChain(t *testing.T) {
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := exec.NewCommandExecutor().Run(ctx, exec.Command{
		Name: "podman",
		Args: []string{"--url", env.Host, "run", "--rm", "--network", "none",
			"--label", "io.podvm.managed=true", env.Image, "echo", "through the socket"},
	})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
	assert.Equal(t, "through the socket\n", res.Stdout)
}
