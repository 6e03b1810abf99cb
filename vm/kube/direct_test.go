package kube_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	osexec "os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/agent/psk"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/kube"
)

// This file shows the direct channel: where the caller reaches the pod
// network (these tests run on the cluster's node), calls go to the
// sandbox's agent over it, not through the API server's attach stream.

// newDirect makes a sandbox with the agent and returns it with its pod's
// IP, once the caller holds a connection to the agent's peers' port.
func newDirect(ctx context.Context, t *testing.T, e env, cfg vm.Config) (vm.VM, string) {
	t.Helper()
	v, err := kube.New(ctx, e.config(cfg), e.options()...)
	require.NoError(t, err)
	require.NoError(t, v.Create(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.NoError(t, v.Remove(ctx))
	})
	// Create dials the address the agent finds on the pod's interface,
	// and does not wait for the kubelet to report it in the pod's status:
	// the connection is to the status's IP once it names one.
	var ip string
	require.Eventually(t, func() bool {
		pod, err := e.cs.CoreV1().Pods(e.namespace).Get(ctx, v.ID(), metav1.GetOptions{})
		require.NoError(t, err)
		ip = pod.Status.PodIP
		return ip != ""
	}, time.Minute, 50*time.Millisecond, "the pod's status names no IP")
	require.Eventually(t, func() bool { return peerConns(t, ip) > 0 }, time.Minute, 20*time.Millisecond,
		"no connection to %s:%d: calls still go through the API server", ip, agent.PeerPort)
	return v, ip
}

// peerConns counts this machine's established TCP connections to the
// agent's peers' port at ip (IPv4), from /proc/net/tcp.
func peerConns(t *testing.T, ip string) int {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	require.NoError(t, err)
	defer f.Close()
	a := net.ParseIP(ip).To4()
	require.NotNil(t, a, "an IPv4 pod address")
	// The kernel prints the address as the hex of its native-endian
	// uint32, the port as big-endian hex.
	want := fmt.Sprintf("%08X:%04X", binary.LittleEndian.Uint32(a), agent.PeerPort)
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 3 && fields[2] == want && fields[3] == "01" { // ESTABLISHED
			n++
		}
	}
	return n
}

// Calls go over the direct channel, carry what they should, and a
// peer's connection is not what keeps the sandbox: the pod's policy lets
// in that port alone.
func TestDirectChannel(t *testing.T) {
	e := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	v, _ := newDirect(ctx, t, e, vm.Config{})

	const size = 64 << 20
	res, err := v.Run(ctx, exec.Command{Name: "head", Args: []string{"-c", strconv.Itoa(size), "/dev/zero"}, MaxOutputBytes: size})
	require.NoError(t, err)
	assert.Len(t, res.Stdout, size)
	assert.False(t, res.Truncated)

	// Files and held processes go the same way.
	require.NoError(t, vm.WriteFile(ctx, v, "/tmp/direct", []byte("over the pod network"), 0o644))
	got, err := vm.ReadFile(ctx, v, "/tmp/direct", 1<<10)
	require.NoError(t, err)
	assert.Equal(t, "over the pod network", string(got))
}

// A cut of the direct channel under a Run in flight fails that Run,
// never a short success; the sandbox runs on, its later calls on the
// attach stream.
func TestDirectChannelCut(t *testing.T) {
	e := need(t)
	if _, err := osexec.LookPath("iptables"); err != nil {
		t.Skip("cutting a connection needs iptables")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	v, ip := newDirect(ctx, t, e, vm.Config{})

	// Every packet from here to the agent's port is answered with a
	// reset: the connections break as a cut pod network would break them.
	rule := []string{"OUTPUT", "-p", "tcp", "-d", ip, "--dport", strconv.Itoa(agent.PeerPort), "-j", "REJECT", "--reject-with", "tcp-reset"}
	cut := func() {
		out, err := osexec.Command("iptables", append([]string{"-I"}, rule...)...).CombinedOutput()
		require.NoError(t, err, "iptables: %s", out)
		t.Cleanup(func() { _ = osexec.Command("iptables", append([]string{"-D"}, rule...)...).Run() })
	}

	// A command that prints forever, through a writer that cuts the
	// channel once output flows.
	flowing := make(chan struct{})
	w := &firstWrite{seen: flowing}
	done := make(chan struct{})
	var res *exec.Result
	var err error
	go func() {
		defer close(done)
		res, err = v.Run(ctx, exec.Command{Name: "cat", Args: []string{"/dev/zero"}, Stdout: w, Timeout: time.Minute})
	}()
	select {
	case <-flowing:
	case <-done:
		t.Fatalf("the Run ended before it printed: %+v, %v", res, err)
	}
	cut()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the Run went on 30 s after its channel was cut")
	}
	require.Error(t, err, "a Run whose channel broke must fail")
	assert.NotContains(t, err.Error(), "timed out", "it failed of the cut, not of its timeout")
	assert.ErrorIs(t, err, vm.ErrUnavailable)

	// The sandbox lives on: the next calls take the attach stream.
	res, err = v.Run(ctx, exec.Command{Name: "echo", Args: []string{"still here"}})
	require.NoError(t, err)
	assert.Equal(t, "still here\n", res.Stdout)
}

// firstWrite closes seen at its first byte and discards everything.
type firstWrite struct {
	seen chan struct{}
	n    int
}

func (f *firstWrite) Write(p []byte) (int, error) {
	if f.n == 0 && len(p) > 0 {
		close(f.seen)
	}
	f.n += len(p)
	return len(p), nil
}

// Another pod reaches the agent's port (an enforced policy lets that
// port in, from anywhere) but gets no session: without the key the
// handshake ends it before the agent says a word of its protocol.
func TestAgentPortRefusesOtherPods(t *testing.T) {
	e := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, ip := newDirect(ctx, t, e, vm.Config{})
	other, err := kube.New(ctx, e.config(vm.Config{Network: "pod"}), e.options()...)
	require.NoError(t, err)
	require.NoError(t, other.Create(ctx))
	defer func() { assert.NoError(t, other.Remove(context.WithoutCancel(ctx))) }()

	port := strconv.Itoa(agent.PeerPort)
	for name, script := range map[string]string{
		// Says nothing: dropped once the handshake's time is up.
		"silent": `nc -w 15 "$1" "$2" </dev/null | wc -c`,
		// Speaks psk with a made-up proof: gets the agent's nonce and
		// proof (64 bytes), then the end, never a Hello.
		"guessing": `(printf %s "$3"; head -c 32 /dev/urandom; sleep 1; head -c 32 /dev/urandom; sleep 3) | nc -w 15 "$1" "$2" | wc -c`,
		// Speaks the agent's protocol straight away: refused as well.
		"protocol": `(printf '\001\000\000\000\000\000\000\000\000'; sleep 3) | nc -w 15 "$1" "$2" | wc -c`,
	} {
		res, err := other.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", script, "sh", ip, port, psk.Magic}, Timeout: time.Minute})
		require.NoError(t, err, name)
		n, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
		want := map[string]int{"silent": 0, "guessing": 64, "protocol": 0}[name]
		assert.Equal(t, want, n, "%s: bytes the agent sent another pod (stderr %q)", name, res.Stderr)
	}
}

// With kube.WithNetworkPolicy, nothing of the caller's runs in a pod with
// a deny-all policy before the pod's status names its IP, which plugins
// that find pods by it need to hold the policy: Create returns only then,
// on both paths. (This cluster enforces no policy; the test declares it
// does to see the wait. Without the wait, Create returns while the status
// has no IP yet: the kubelet reports it at its next relist.)
func TestEnforcedPolicyWaitsForTheIP(t *testing.T) {
	e := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, viaExec := range []bool{false, true} {
		cfg := e.config(vm.Config{PodmanExec: viaExec})
		v, err := kube.New(ctx, cfg, kube.WithKubeconfig(e.kubeconfig), kube.WithNamespace(e.namespace),
			kube.WithNetworkPolicy(), kube.WithLifetime(time.Hour))
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, v.Remove(context.WithoutCancel(ctx))) })
		require.NoError(t, v.Create(ctx))
		pod, err := e.cs.CoreV1().Pods(e.namespace).Get(ctx, v.ID(), metav1.GetOptions{})
		require.NoError(t, err)
		assert.NotEmpty(t, pod.Status.PodIP, "exec path %v: Create returned before the pod's status named its IP", viaExec)
		res, err := v.Run(ctx, exec.Command{Name: "echo", Args: []string{"ok"}})
		require.NoError(t, err)
		assert.Equal(t, "ok\n", res.Stdout)
	}
}
