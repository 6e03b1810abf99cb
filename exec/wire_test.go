package exec_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
)

func TestCommandJSON(t *testing.T) {
	t.Parallel()
	cmd := exec.Command{Name: "go", Args: []string{"build", "./..."}, Dir: "/src", Env: []string{"CGO_ENABLED=0"}, Timeout: 1500 * time.Millisecond, MaxOutputBytes: 4096}
	data, err := json.Marshal(cmd)
	require.NoError(t, err)
	assert.JSONEq(t, `{"command":"go","args":["build","./..."],"dir":"/src","env":["CGO_ENABLED=0"],"timeout":1.5,"max_output_bytes":4096}`, string(data))

	var back exec.Command
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Equal(t, cmd, back)

	limited := exec.Command{Name: "make", MaxMemoryBytes: 1 << 30, MaxPids: 512, MaxCPUTime: 90 * time.Second}
	data, err = json.Marshal(limited)
	require.NoError(t, err)
	assert.JSONEq(t, `{"command":"make","max_memory_bytes":1073741824,"max_pids":512,"max_cpu_time":90}`, string(data))
	back = exec.Command{}
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Equal(t, limited, back)
}

func TestCommandJSONRejects(t *testing.T) {
	t.Parallel()
	for _, in := range []string{`{"command":"x","timeout":-1}`, `{"command":"x","timeout":1e300}`, `{"command":"x","max_cpu_time":-1}`, `{"command":"x","max_cpu_time":1e300}`, `{"command":7}`, `[]`} {
		var c exec.Command
		assert.Error(t, json.Unmarshal([]byte(in), &c), in)
	}
}

func TestResultJSON(t *testing.T) {
	t.Parallel()
	res := exec.Result{Stdout: "out\n", Stderr: "err\n", ExitCode: 3, Duration: 2500 * time.Microsecond, TimedOut: true, Truncated: true, StdoutBytes: 4, StderrBytes: 4}
	data, err := json.Marshal(res)
	require.NoError(t, err)
	assert.JSONEq(t, `{"stdout":"out\n","stderr":"err\n","exit_code":3,"duration_ms":2.5,"is_timeout":true,"truncated":true,"stdout_bytes":4,"stderr_bytes":4}`, string(data))
	var back exec.Result
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Equal(t, res, back)

	// A pointer marshals the same way.
	data2, err := json.Marshal(&res)
	require.NoError(t, err)
	assert.JSONEq(t, string(data), string(data2))
}

func TestResultJSONKeepsTails(t *testing.T) {
	t.Parallel()
	cmd := helper("lines", "5000")
	cmd.MaxOutputBytes = 200
	res, err := host.Run(t.Context(), cmd)
	require.NoError(t, err)
	data, err := json.Marshal(res)
	require.NoError(t, err)
	var back exec.Result
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Equal(t, "line 4999\nline 5000\n", back.StdoutTail(2))
	assert.Equal(t, res.StdoutTail(50), back.StdoutTail(50))
}

func TestResultJSONUsage(t *testing.T) {
	t.Parallel()
	res := exec.Result{ExitCode: 0, Usage: &exec.Usage{UserCPU: 1500 * time.Millisecond, SystemCPU: 250 * time.Microsecond, PeakRSS: 64 << 20}}
	data, err := json.Marshal(res)
	require.NoError(t, err)
	assert.JSONEq(t, `{"stdout":"","stderr":"","exit_code":0,"duration_ms":0,"is_timeout":false,"truncated":false,"stdout_bytes":0,"stderr_bytes":0,
		"usage":{"user_cpu_ms":1500,"system_cpu_ms":0.25,"peak_rss_bytes":67108864}}`, string(data))
	var back exec.Result
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Equal(t, res, back)

	// Unknown usage is absent, not zero, and stays unknown.
	data, err = json.Marshal(exec.Result{})
	require.NoError(t, err)
	assert.NotContains(t, string(data), "usage")
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Nil(t, back.Usage)

	for _, in := range []string{`{"usage":{"user_cpu_ms":-1}}`, `{"usage":{"system_cpu_ms":1e300}}`, `{"usage":{"peak_rss_bytes":-5}}`} {
		assert.Error(t, json.Unmarshal([]byte(in), &back), in)
	}
}
