package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	osexec "os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/kube"
)

// The kube comparison: podvm's Kubernetes backend (vm/kube) against
// kubectl, what a user would otherwise shell out to, on the cluster
// $KUBECONFIG names (`make kube`'s), with the image $PODVM_KUBE_IMAGE on
// its nodes, in $PODVM_KUBE_NAMESPACE: a Run's round trip through the
// agent and through exec sessions against `kubectl exec`, round-robin;
// Runs per second from 1 and 16 callers on one pod; a fresh sandbox to
// its first result against `kubectl run --rm -i`; stdout through the
// direct channel, the attach stream alone and exec sessions against
// `kubectl exec` (kubedata.go); a connection to a
// server in the pod through vm.Forward against `kubectl port-forward`,
// the forward made for the connection and kept; a Get from a warm
// vm.Pool. Without a cluster it is skipped, saying why. kubectl is
// $PODVM_KUBECTL, else the one on PATH; it finds the cluster through
// $KUBECONFIG. Every pod carries the run's label and podvm's owner
// labels, and is deleted at the section's end and by the bench's cleanup.

// Names of the rows.
const (
	nameKubeAgent   = "podvm kube, agent"
	nameKubeExec    = "podvm kube, exec sessions"
	nameKubectlExec = "`kubectl exec POD -- true` (a process)"
	nameKubectlRun  = "`kubectl run --rm -i … -- echo hi` (a process)"

	nameKubeForwardOnce = "podvm kube, agent: `vm.Forward`, one connection, `Close`"
	nameKubectlPFOnce   = "`kubectl port-forward pod/NAME :7003` started, its line awaited, one connection, killed"
	nameKubeForwardKept = "podvm kube, agent: a kept `vm.Forward`"
	nameKubeForwardWarm = "podvm kube, agent: a kept `vm.Forward` `WithWarmConnection`"
	nameKubectlPFKept   = "a kept `kubectl port-forward pod/NAME :7003` (a process)"
)

// kubeCallers are the caller counts of the concurrency measure.
var kubeCallers = []int{1, 16}

// The targets.
const (
	kubeRoundTripTarget = 0.05 // the agent's round trip p50, against `kubectl exec`'s
	kubeRateTarget      = 500  // Runs/s through the agent with 16 callers
	kubeFirstTarget     = 0.5  // a fresh sandbox's first result p50, against `kubectl run --rm -i`'s (issue 41)
	kubeForwardTarget   = 0.1  // a forward made for one connection, against `kubectl port-forward`'s
)

var (
	trueCommand = exec.Command{Name: "true"}
	echoHiArgv  = []string{"echo", "hi"}
)

// errLostOutput is `kubectl run -i` exiting 0 without the command's
// output: it attaches once it sees the pod running, and what the command
// printed before the attach is lost (it reads the logs instead only when
// it sees the pod already ended).
var errLostOutput = errors.New("kubectl run exited 0 without the command's output")

// kubeResult is the section's measurements, or why it was skipped.
type kubeResult struct {
	skip                      string
	server, node              string // versions, for the caption
	namespace, image, kubectl string
	rt, first                 []*series
	rates                     []rate // per kubeCallers
	rateSkip                  string
	fwdOnce, fwdKept          []*series // through a forward made per connection; through a kept one
	fwdSkip                   string
	pool                      poolResult
	data                      kubeDataResult
	phases                    phases // a fresh sandbox's first result, phase by phase
}

// cluster is the section's cluster and everything the bench made on it.
type cluster struct {
	kubeconfig, image, namespace string
	kubectl, kubectlWhy          string // kubectl's path, or why there is none
	opts                         []kube.Option
	cs                           kubernetes.Interface
	labels                       map[string]string // of kubectl's pods: the run's and podvm's owner labels
	vms                          []vm.VM
	n                            atomic.Int64 // numbers kubectl's pods
}

// findCluster is the cluster of the environment, or why there is none.
func findCluster(labels map[string]string) (*cluster, string) {
	c := &cluster{kubeconfig: os.Getenv("KUBECONFIG"), image: os.Getenv("PODVM_KUBE_IMAGE"), namespace: os.Getenv("PODVM_KUBE_NAMESPACE"), labels: labels}
	switch {
	case c.kubeconfig == "":
		return nil, "no Kubernetes cluster: KUBECONFIG is not set (`make kube` brings one up; `make bench` then brings its environment in)"
	case c.image == "":
		return nil, "PODVM_KUBE_IMAGE is not set: the image on the cluster's nodes (scripts/kube-up.sh exports it)"
	}
	if c.namespace == "" {
		c.namespace = "default"
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return nil, "KUBECONFIG: " + oneLine(err)
	}
	rc.Timeout = 30 * time.Second
	if c.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, "KUBECONFIG: " + oneLine(err)
	}
	// As vm/kube's tests: where the network plugin does not enforce
	// policies, accept it in writing.
	policy := kube.WithUnenforcedNetworkPolicy()
	if os.Getenv("PODVM_KUBE_NETWORKPOLICY") == "enforced" {
		policy = kube.WithNetworkPolicy()
	}
	c.opts = []kube.Option{kube.WithKubeconfig(c.kubeconfig), kube.WithNamespace(c.namespace), policy, kube.WithLifetime(time.Hour)}
	c.kubectl = os.Getenv("PODVM_KUBECTL")
	if c.kubectl == "" {
		if c.kubectl, err = osexec.LookPath("kubectl"); err != nil {
			c.kubectl, c.kubectlWhy = "", "no kubectl: set PODVM_KUBECTL (scripts/kube-up.sh exports the cluster's own)"
		}
	}
	return c, ""
}

// probe fills r's caption, or says why the cluster does not answer.
func (c *cluster) probe(ctx context.Context, r *kubeResult) string {
	v, err := c.cs.Discovery().ServerVersion()
	if err != nil {
		return fmt.Sprintf("the cluster of %s does not answer: %s", c.kubeconfig, oneLine(err))
	}
	r.server = v.GitVersion
	if nodes, err := c.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil && len(nodes.Items) > 0 {
		r.node = fmt.Sprintf("%d node%s, %s", len(nodes.Items), plural(len(nodes.Items)), nodes.Items[0].Status.NodeInfo.ContainerRuntimeVersion)
	}
	r.namespace, r.image, r.kubectl = c.namespace, c.image, c.kubectl
	return ""
}

// backend is podvm's kube backend as a bench backend; the host is not
// its: the options name the cluster.
func (c *cluster) backend(name string, podmanExec bool) backend {
	return backend{name: name, new: func(ctx context.Context, _ string, cfg vm.Config) (vm.VM, error) {
		cfg.PodmanExec = podmanExec
		return kube.New(ctx, cfg, c.opts...)
	}}
}

// sandbox makes and creates a sandbox of cfg on be, kept until release;
// without one it says why.
func (c *cluster) sandbox(ctx context.Context, be backend, cfg vm.Config) (vm.VM, string) {
	v, err := be.new(ctx, "", cfg)
	if err == nil {
		c.vms = append(c.vms, v) // Remove is safe after a failed Create
		err = v.Create(ctx)
	}
	if err != nil {
		return nil, "failed: " + oneLine(err)
	}
	return v, ""
}

func (b *bench) kubes(ctx context.Context) error {
	r := &kubeResult{}
	b.kube = r
	c, why := findCluster(b.p.labels)
	if why == "" {
		why = c.probe(ctx, r)
	}
	if why != "" {
		r.skip = why
		fmt.Fprintln(os.Stderr, "bench: kube: skipped:", why)
		return nil
	}
	b.cluster = c
	defer c.releaseQuietly(ctx)
	cfg := vm.Config{Image: c.image, Pull: vm.PullNever, Labels: map[string]string{labelRun: b.p.labels[labelRun]}}
	agent, viaExec := c.backend(nameKubeAgent, false), c.backend(nameKubeExec, true)

	progress("kube: setting up")
	var alts []alt
	var agentVM, execVM vm.VM
	for _, be := range []backend{agent, viaExec} {
		v, why := c.sandbox(ctx, be, cfg)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a := alt{name: be.name, skip: why}
		if v != nil {
			a.op = vmTrue(v)
		}
		if be.name == nameKubeAgent {
			agentVM, r.rateSkip = v, why
		} else {
			execVM = v
		}
		alts = append(alts, a)
	}
	kc := alt{name: nameKubectlExec, skip: c.kubectlWhy}
	var kpod string
	if c.kubectl != "" {
		pod, err := c.startPod(ctx, "exec", "sleep", "3600")
		kpod = pod
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			kc.skip = "failed: " + oneLine(err)
		} else {
			kc.op = c.execTrue(pod)
		}
	}
	alts = append(alts, kc)
	var err error
	if r.rt, err = measure(ctx, "kube: round trip", alts, b.sz.warm, b.sz.exec, b.sz.budget); err != nil {
		return err
	}

	if agentVM != nil {
		for _, callers := range kubeCallers {
			progress("kube: concurrency: %d callers", callers)
			r.rates = append(r.rates, hammerEach(ctx, func() op { return vmTrue(agentVM) }, callers, b.sz.window))
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	if err := b.kubeData(ctx, c, cfg, agentVM, execVM, kpod); err != nil {
		return err
	}
	if err := b.kubeForwards(ctx, c, agentVM, r); err != nil {
		return err
	}
	// The long-lived pods are done with: the rest measures fresh ones.
	c.releaseQuietly(ctx)

	alts = []alt{{name: nameKubeAgent, op: vmLifecycleRun(agent, "", cfg, func(v vm.VM) op {
		return func(ctx context.Context) error { return vmRunOK(ctx, v, echoHiArgv, "hi") }
	})}}
	if c.kubectl == "" {
		alts = append(alts, alt{name: nameKubectlRun, skip: c.kubectlWhy})
	} else {
		alts = append(alts, alt{name: nameKubectlRun, op: c.runEcho()})
	}
	// Two warm-up rounds: measure drops an alternative whose every
	// warm-up round fails, and kubectl's loses its output now and then
	// (errLostOutput), which is a failure, not a reason to drop it.
	if r.first, err = measure(ctx, "kube: first result", alts, 2, b.sz.lifecycle, b.sz.budget); err != nil {
		return err
	}
	progress("kube: first result, phase by phase")
	r.phases = b.kubeFirstPhases(ctx, c, agent, cfg, max(b.sz.lifecycle, 5))
	if ctx.Err() != nil {
		return ctx.Err()
	}

	r.pool = poolResult{name: nameKubeAgent, get: &series{name: nameKubeAgent}, cycle: &series{name: nameKubeAgent}, plain: &series{name: nameKubeAgent}}
	if err := b.warmPool(ctx, agent, cfg, max(b.sz.lifecycle, minRounds), &r.pool); err != nil {
		return err
	}
	progress("")
	return nil
}

// vmTrue runs `true` with v.Run and fails unless it exits 0 and prints
// nothing.
func vmTrue(v vm.VM) op {
	return func(ctx context.Context) error {
		res, err := v.Run(ctx, trueCommand)
		if err != nil {
			return err
		}
		return checkTrue(res.Stdout, res.Stderr, res.ExitCode)
	}
}

func checkTrue(stdout, stderr string, code int) error {
	if stdout != "" || stderr != "" || code != 0 {
		return fmt.Errorf("wrong result of true: stdout %q stderr %q exit %d, want nothing and 0", stdout, stderr, code)
	}
	return nil
}

// podName is a new name for one of kubectl's pods.
func (c *cluster) podName(what string) string {
	return fmt.Sprintf("podvm-bench-%s-%s-%d", c.labels[labelRun], what, c.n.Add(1))
}

// labelList is the pods' labels as kubectl's --labels takes them.
func (c *cluster) labelList() string {
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(c.labels)) {
		kv = append(kv, k+"="+c.labels[k])
	}
	return strings.Join(kv, ",")
}

// command is `kubectl -n NAMESPACE args...`.
func (c *cluster) command(ctx context.Context, args ...string) *osexec.Cmd {
	return osexec.CommandContext(ctx, c.kubectl, append([]string{"-n", c.namespace}, args...)...)
}

// startPod makes a pod of kubectl's running command, named after what,
// as kubectl would, and waits until it is ready. The command should end
// within the hour whatever happens to the bench (a sleep 3600).
func (c *cluster) startPod(ctx context.Context, what string, command ...string) (string, error) {
	name := c.podName(what)
	for _, args := range [][]string{
		append([]string{"run", name, "--restart=Never", "--image=" + c.image, "--image-pull-policy=Never", "--labels=" + c.labelList(), "--command", "--"}, command...),
		{"wait", "--for=condition=Ready", "--timeout=2m", "pod/" + name},
	} {
		if out, err := c.command(ctx, args...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("kubectl %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
		}
	}
	return name, nil
}

// execTrue is `kubectl exec POD -- true`, its result checked.
func (c *cluster) execTrue(pod string) op {
	return func(ctx context.Context) error {
		var stdout, stderr bytes.Buffer
		cmd := c.command(ctx, "exec", pod, "--", "true")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		code, err := exitCode(cmd.Run())
		if err != nil {
			return fmt.Errorf("kubectl: %w", err)
		}
		return checkTrue(stdout.String(), stderr.String(), code)
	}
}

// runEcho is `kubectl run --rm -i … -- echo hi` in a pod of its own,
// which kubectl deletes before it exits (without waiting for it to go,
// as podvm's Remove); it fails unless kubectl exits 0 having printed the
// line hi.
func (c *cluster) runEcho() op {
	return func(ctx context.Context) error {
		var stdout, stderr bytes.Buffer
		cmd := c.command(ctx, "run", "--rm", "-i", "--restart=Never", "--image="+c.image, "--image-pull-policy=Never",
			"--labels="+c.labelList(), c.podName("run"), "--", "echo", "hi")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		code, err := exitCode(cmd.Run())
		switch {
		case err != nil:
			return fmt.Errorf("kubectl: %w", err)
		case code != 0:
			return fmt.Errorf("kubectl run: exit %d: %s", code, strings.TrimSpace(stderr.String()))
		case !slices.Contains(strings.Split(stdout.String(), "\n"), "hi"):
			return fmt.Errorf("%w: it printed %q, want the line hi", errLostOutput, stdout.String())
		}
		return nil
	}
}

// release removes the sandboxes the section kept with their own Remove,
// then deletes every pod and network policy of this run that is left
// (kubectl's, or what an interrupted operation left) and waits until the
// pods are gone.
func (c *cluster) release(ctx context.Context) error {
	var errs []error
	for _, v := range c.vms {
		if err := v.Remove(ctx); err != nil {
			errs = append(errs, fmt.Errorf("kube: %s: Remove: %w", v.ID(), err))
		}
	}
	c.vms = nil
	sel := metav1.ListOptions{LabelSelector: labelRun + "=" + c.labels[labelRun]}
	pods := c.cs.CoreV1().Pods(c.namespace)
	grace := int64(1)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace}, sel); err != nil {
		errs = append(errs, fmt.Errorf("kube: deleting the run's pods: %w", err))
	}
	if err := c.cs.NetworkingV1().NetworkPolicies(c.namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		errs = append(errs, fmt.Errorf("kube: deleting the run's network policies: %w", err))
	}
	for {
		list, err := pods.List(ctx, sel)
		if err == nil && len(list.Items) == 0 {
			break
		}
		if ctx.Err() != nil {
			var left []string
			if list != nil {
				for _, p := range list.Items {
					left = append(left, p.Name)
				}
			}
			errs = append(errs, fmt.Errorf("kube: pods of this run are left in %s: %v %v", c.namespace, left, err))
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return errors.Join(errs...)
}

// releaseQuietly releases with a context of its own; what it cannot
// remove, the bench's cleanup tries again and reports.
func (c *cluster) releaseQuietly(ctx context.Context) {
	rctx, cancel := removeContext(ctx)
	defer cancel()
	_ = c.release(rctx)
}

func (b *bench) reportKube(w io.Writer) {
	r := b.kube
	if r == nil {
		return
	}
	if r.skip != "" {
		fmt.Fprintf(w, "\n**Kubernetes** (`kube`): skipped: %s\n", r.skip)
		return
	}
	node := ""
	if r.node != "" {
		node = " (" + r.node + ")"
	}
	kubectl := "no kubectl"
	if r.kubectl != "" {
		kubectl = "kubectl `" + r.kubectl + "`"
	}
	fmt.Fprintf(w, "\n**Kubernetes** (`kube`): podvm's kube backend against %s, on Kubernetes %s%s, namespace `%s`, image `%s` (never pulled)\n",
		kubectl, r.server, node, r.namespace, r.image)
	reportP50(w, "**Kubernetes, a Run's round trip** of `true` in one running pod, its result checked;", r.rt, nameKubectlExec, "`kubectl exec`")

	fmt.Fprintf(w, "\n**Kubernetes, concurrency**: Runs of `true` per second through the agent, the callers sharing one pod, %v per measure\n\n", b.sz.window)
	fmt.Fprint(w, "| how |")
	for _, c := range kubeCallers {
		fmt.Fprintf(w, " %d caller%s |", c, plural(c))
	}
	fmt.Fprint(w, " failures |\n|---|")
	for range kubeCallers {
		fmt.Fprint(w, "--:|")
	}
	fmt.Fprintln(w, "---|")
	if r.rateSkip != "" {
		fmt.Fprintf(w, "| %s |%s %s |\n", nameKubeAgent, strings.Repeat(" |", len(kubeCallers)), r.rateSkip)
	} else {
		fmt.Fprintf(w, "| %s |", nameKubeAgent)
		var fails []string
		for i, rt := range r.rates {
			fmt.Fprintf(w, " %.1f |", rt.perSecond())
			if rt.fails > 0 {
				fails = append(fails, fmt.Sprintf("%d of %d with %d: %s", rt.fails, rt.fails+rt.ops, kubeCallers[i], oneLine(rt.err)))
			}
		}
		fmt.Fprintf(w, " %s |\n", orNone(strings.Join(fails, "; ")))
	}

	switch {
	case r.fwdSkip != "":
		fmt.Fprintf(w, "\n**Kubernetes, forwards**: skipped: %s\n", r.fwdSkip)
	case len(r.fwdOnce) > 0:
		srv := shellLine(ncArgv(echoPort, echoArgv...))
		reportP50(w, fmt.Sprintf("**Kubernetes, a forward for one connection**: a forward made, one connection through it (connect, write a line, read it back, close), the forward closed: `vm.Forward` to `%s` in podvm's sandbox, against `kubectl port-forward pod/NAME :%d` to the same server in a pod of kubectl's, started, its `Forwarding from` line awaited, killed;", srv, echoPort),
			r.fwdOnce, nameKubectlPFOnce, "`kubectl port-forward`")
		reportP50(w, "**Kubernetes, a connection through a kept forward**: connect, write a line, read it back, close; the forwards and the kubectl process made before;",
			r.fwdKept, nameKubectlPFKept, "`kubectl port-forward`")
	}

	reportP50(w, "**Kubernetes, a fresh sandbox to its first result**: `kube.New`, `Create`, `Run` of `echo hi`, `Remove`, against `kubectl run --rm -i --restart=Never --image=IMAGE --image-pull-policy=Never NAME -- echo hi`; both delete the pod without waiting for it to go; the output checked; after 2 warm-up rounds;",
		r.first, nameKubectlRun, "`kubectl run`")
	for _, s := range r.first {
		if s.name != nameKubectlRun || s.skip != "" || !errors.Is(s.err, errLostOutput) {
			continue
		}
		fmt.Fprintf(w, "\n- `kubectl run -i` lost the output of `echo hi` in %d of %d runs, exiting 0: it attaches once it sees the pod running, and what the command printed before the attach is lost (it reads the logs instead only when it sees the pod already ended). Those runs count as failures.\n",
			s.fails, s.fails+len(s.d))
	}
	r.phases.report(w)
	reportWarmPool(w, "**Kubernetes, pool, warm**", []poolResult{r.pool})
	b.reportKubeData(w)
	b.reportKubeTargets(w)
}

func (b *bench) reportKubeTargets(w io.Writer) {
	r := b.kube
	fmt.Fprintln(w, "\n**Kubernetes targets**\n\n| target | measured | result |\n|---|---|---|")
	verdict := func(what, measured string, have, pass bool, bound string) {
		switch {
		case !have:
			fmt.Fprintf(w, "| %s | not measured | – |\n", what)
		case pass:
			fmt.Fprintf(w, "| %s | %s | pass |\n", what, measured)
		default:
			fmt.Fprintf(w, "| %s | %s | **miss**, bounded by %s |\n", what, measured, bound)
		}
	}
	p50ratio := func(what string, x, y *series, limit float64, bound string) {
		if x == nil || y == nil {
			verdict(what, "", false, false, "")
			return
		}
		q := float64(x.p50()) / float64(y.p50())
		verdict(what, fmt.Sprintf("%.3f× (%s vs %s)", q, ms(x.p50()), ms(y.p50())), true, q <= limit, bound)
	}

	bound := "the agent's channel: a Run goes through the API server and the kubelet on the pod's one attach stream"
	if e := find(r.rt, nameKubeExec); e != nil {
		bound += fmt.Sprintf("; an exec session, a new stream per Run, takes %s", ms(e.p50()))
	}
	p50ratio(fmt.Sprintf("kube, agent: round trip p50 ≤ %.2f× `kubectl exec`'s", kubeRoundTripTarget),
		find(r.rt, nameKubeAgent), find(r.rt, nameKubectlExec), kubeRoundTripTarget, bound)

	what := fmt.Sprintf("kube, agent: ≥ %d Runs/s with %d callers on one pod", kubeRateTarget, kubeCallers[len(kubeCallers)-1])
	if len(r.rates) == len(kubeCallers) {
		one, all := r.rates[0].perSecond(), r.rates[len(r.rates)-1].perSecond()
		verdict(what, fmt.Sprintf("%.0f/s", all), true, all >= kubeRateTarget,
			fmt.Sprintf("two cores shared by the API server, the kubelet, containerd and this process: one caller gets %.0f/s", one))
	} else {
		verdict(what, "", false, false, "")
	}

	p50ratio(fmt.Sprintf("kube, agent: a fresh sandbox's first result p50 ≤ %.1f× `kubectl run --rm -i`'s", kubeFirstTarget),
		find(r.first, nameKubeAgent), find(r.first, nameKubectlRun), kubeFirstTarget,
		"the pod's start, and the agent's delivery through the attach (3 MiB, through the API server and the kubelet) before the first result")

	bound = "the pod's attach stream, which the connection crosses both ways through the API server and the kubelet"
	if k := find(r.fwdKept, nameKubeForwardKept); k != nil {
		bound += fmt.Sprintf(": a connection through a kept forward takes %s", ms(k.p50()))
	}
	p50ratio(fmt.Sprintf("kube, agent: a forward for one connection p50 ≤ %.1f× `kubectl port-forward`'s", kubeForwardTarget),
		find(r.fwdOnce, nameKubeForwardOnce), find(r.fwdOnce, nameKubectlPFOnce), kubeForwardTarget, bound)

	b.reportKubeDataTargets(w, verdict)

	p := r.pool
	what = fmt.Sprintf("kube, agent: Get p50 ≤ %s with a warm pool", ms(getTarget))
	if p.skip != "" || p.get == nil || !p.get.ok() {
		verdict(what, "", false, false, "")
	} else {
		verdict(what, ms(p.get.p50()), true, p.get.p50() <= getTarget,
			fmt.Sprintf("this process: a warm Get takes a ready sandbox and asks nothing of the cluster (p90 %s)", ms(p.get.p90())))
	}
}

// kubeForwards measures connections to an echo server in the agent's
// sandbox v through vm.Forward against `kubectl port-forward` to the
// same server in a pod of kubectl's: a forward made for one connection,
// then connections through a kept forward. The server, the forwards and
// the kubectl processes it starts end before it returns; the pod goes
// with the section's.
func (b *bench) kubeForwards(ctx context.Context, c *cluster, v vm.VM, r *kubeResult) error {
	if v == nil {
		r.fwdSkip = r.rateSkip
		return nil
	}
	progress("kube: forwards: setting up")
	fail := func(err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.fwdSkip = "failed: " + oneLine(err)
		return nil
	}
	srv, err := startServer(ctx, v, echoPort, ncArgv(echoPort, echoArgv...))
	if err != nil {
		return fail(err)
	}
	defer func() { _ = endProcess(ctx, srv) }()
	to := loopback(echoPort)
	kept, err := vm.Forward(ctx, v, "tcp", to)
	if err != nil {
		return fail(err)
	}
	defer kept.Close()
	warm, err := vm.Forward(ctx, v, "tcp", to, vm.WithWarmConnection())
	if err != nil {
		return fail(err)
	}
	defer warm.Close()

	pfOnce := alt{name: nameKubectlPFOnce, skip: c.kubectlWhy}
	pfKept := alt{name: nameKubectlPFKept, skip: c.kubectlWhy}
	if c.kubectl != "" {
		pod, pf, err := c.echoPod(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			pfOnce.skip, pfKept.skip = "failed: "+oneLine(err), "failed: "+oneLine(err)
		} else {
			defer pf.close()
			pfOnce.op, pfKept.op = c.portForwardEcho(pod), echoAt(pf.addr)
		}
	}

	once := []alt{{name: nameKubeForwardOnce, op: func(ctx context.Context) error {
		f, err := vm.Forward(ctx, v, "tcp", to)
		if err != nil {
			return err
		}
		return errors.Join(echoAt(f.Addr().String())(ctx), f.Close())
	}}, pfOnce}
	if r.fwdOnce, err = measure(ctx, "kube: a forward per connection", once, b.sz.warm, b.sz.exec, b.sz.budget); err != nil {
		return err
	}
	keptAlts := []alt{
		{name: nameKubeForwardKept, op: echoAt(kept.Addr().String())},
		{name: nameKubeForwardWarm, op: echoAt(warm.Addr().String())},
		pfKept,
	}
	r.fwdKept, err = measure(ctx, "kube: a kept forward", keptAlts, b.sz.warm, b.sz.exec, b.sz.budget)
	return err
}

// echoPod starts a pod of kubectl's serving echoes on echoPort, as the
// agent's sandbox does, and a `kubectl port-forward` to it, once a line
// comes back through it.
func (c *cluster) echoPod(ctx context.Context) (string, *portForward, error) {
	pod, err := c.startPod(ctx, "echo", "sh", "-c", shellLine(ncArgv(echoPort, echoArgv...))+" & exec sleep 3600")
	if err != nil {
		return "", nil, err
	}
	// The pod is ready, its nc may not listen yet; a connection that
	// fails may end kubectl. The one kept lives on ctx.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		pf, err := c.portForward(ctx, pod, echoPort)
		if err == nil {
			if err = echoAt(pf.addr)(wctx); err == nil {
				return pod, pf, nil
			}
			pf.close()
		}
		select {
		case <-wctx.Done():
			return "", nil, fmt.Errorf("no echo through kubectl port-forward: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// portForwardEcho starts `kubectl port-forward` to pod, echoes a line
// through it and kills it.
func (c *cluster) portForwardEcho(pod string) op {
	return func(ctx context.Context) error {
		pf, err := c.portForward(ctx, pod, echoPort)
		if err != nil {
			return err
		}
		defer pf.close()
		return echoAt(pf.addr)(ctx)
	}
}

// portForward is a `kubectl port-forward` process.
type portForward struct {
	cmd  *osexec.Cmd
	addr string        // where it listens: 127.0.0.1 and its port
	done chan struct{} // closed once it exited
}

// portForward starts `kubectl port-forward pod/POD :PORT` and returns
// once it says where it listens (its "Forwarding from 127.0.0.1:..."
// line). Its output is read to the end, so that its lines for each
// connection never hold it back. ctx's end kills it.
func (c *cluster) portForward(ctx context.Context, pod string, port int) (*portForward, error) {
	cmd := c.command(ctx, "port-forward", "pod/"+pod, ":"+strconv.Itoa(port))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("kubectl port-forward: %w", err)
	}
	pf := &portForward{cmd: cmd, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(pf.done)
		lines := bufio.NewScanner(out)
		found := false
		for !found && lines.Scan() {
			if p, ok := strings.CutPrefix(lines.Text(), "Forwarding from 127.0.0.1:"); ok {
				p, _, _ = strings.Cut(p, " ")
				addr <- "127.0.0.1:" + p
				found = true
			}
		}
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
	}()
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case pf.addr = <-addr:
		return pf, nil
	case <-pf.done:
		return nil, fmt.Errorf("kubectl port-forward: %v before it forwarded: %s", cmd.ProcessState, strings.TrimSpace(stderr.String()))
	case <-t.C:
		pf.close()
		return nil, fmt.Errorf("kubectl port-forward: no %q line within a minute", "Forwarding from")
	}
}

// close kills the process and waits for its end.
func (pf *portForward) close() {
	_ = pf.cmd.Process.Kill()
	<-pf.done
}
