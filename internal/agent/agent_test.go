package agent

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSmoke(t *testing.T) {
	a := startAgent(t)
	r := a.sh(context.Background(), "echo hello; echo err >&2; exit 3")
	require.NoError(t, r.err)
	require.Equal(t, "hello\n", r.stdout)
	require.Equal(t, "err\n", r.stderr)
	require.Equal(t, 3, r.Code)
	t.Logf("%+v", r.Exit)
}
