#!/bin/sh
# Checks, with the cluster's own kubectl, that the cluster of
# scripts/kube-up.sh (brought up first if it is not) does what podvm's tests
# rely on, and what it does not:
#  1. a pod of the test image (imagePullPolicy Never) runs `echo hi`;
#  2. `kubectl run --rm -i` carries stdin to the container and its stdout back
#     (attach), and the pod goes;
#  3. exec: stdout, stderr, exit status, stdin;
#  4. limits: the container's memory and CPU limits are in its cgroups, the
#     kubelet's pids limit in the pod's;
#  5. NetworkPolicy is NOT enforced: under a deny-all policy the pod still
#     reaches a listener on the node (so a Network "none" that rests on a
#     policy cannot be shown to hold here).
# Prints what it checks; exits non-zero at the first failure. About 15 s.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
eval "$("$REPO/scripts/kube-up.sh")"
k() { "$PODVM_KUBECTL" "$@"; }
ms() { date +%s%3N; }
fail() { echo "kube-smoke: FAIL: $*" >&2; exit 1; }
ok() { echo "kube-smoke: ok: $*"; }
cleanup() { k delete pod --now --ignore-not-found smoke-echo smoke-cat smoke-exec >/dev/null 2>&1 || true
	k delete networkpolicy --ignore-not-found smoke-deny-all >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup

# 1. echo
t=$(ms)
k run smoke-echo --image="$PODVM_KUBE_IMAGE" --image-pull-policy=Never --restart=Never -- echo hi >/dev/null
k wait --for=jsonpath='{.status.phase}'=Succeeded pod/smoke-echo --timeout=60s >/dev/null ||
	fail "echo pod: $(k get pod smoke-echo -o jsonpath='{.status}')"
[ "$(k logs smoke-echo)" = hi ] || fail "echo pod printed $(k logs smoke-echo)"
ok "pod ran echo hi: created to Succeeded in $(($(ms) - t)) ms"

# 2. attach with stdin
t=$(ms)
out=$(printf 'one\ntwo\n' | k run --rm -i --image="$PODVM_KUBE_IMAGE" --image-pull-policy=Never \
	--restart=Never smoke-cat -- sh -c cat 2>/dev/null) || fail "kubectl run --rm -i: exit $?"
printf '%s\n' "$out" | grep -qx one && printf '%s\n' "$out" | grep -qx two ||
	fail "kubectl run --rm -i gave back: $out"
ok "kubectl run --rm -i: stdin in, stdout back, pod removed, in $(($(ms) - t)) ms"

# 3. exec, in a pod with limits
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: smoke-exec}
spec:
  terminationGracePeriodSeconds: 0
  automountServiceAccountToken: false
  containers:
  - name: c
    image: $PODVM_KUBE_IMAGE
    imagePullPolicy: Never
    command: [sleep, "600"]
    resources:
      limits: {memory: 64Mi, cpu: 500m}
EOF
k wait --for=condition=Ready pod/smoke-exec --timeout=60s >/dev/null || fail "exec pod is not Ready"
t=$(ms)
set +e
out=$(k exec smoke-exec -- sh -c 'echo out; echo err >&2; exit 3' 2>/tmp/kube-smoke.$$)
rc=$?
set -e
err=$(head -n 1 /tmp/kube-smoke.$$) # then kubectl's "command terminated with exit code 3"
rm -f /tmp/kube-smoke.$$
[ "$out" = out ] && [ "$err" = err ] && [ $rc = 3 ] || fail "exec: stdout '$out', stderr '$err', exit $rc"
[ "$(echo abc | k exec -i smoke-exec -- cat)" = abc ] || fail "exec -i: stdin not carried"
ok "exec: stdout, stderr, exit 3, stdin ($(($(ms) - t)) ms for both)"

# 4. limits
mem=$(k exec smoke-exec -- cat /sys/fs/cgroup/memory/memory.limit_in_bytes)
cpu=$(k exec smoke-exec -- cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)
[ "$mem" = 67108864 ] || fail "memory limit in the container's cgroup: $mem, want 67108864"
[ "$cpu" = 50000 ] || fail "CPU quota in the container's cgroup: $cpu, want 50000"
uid=$(k get pod smoke-exec -o jsonpath='{.metadata.uid}')
pids=$(cat /sys/fs/cgroup/pids/kubepods/*/pod"$uid"/pids.max /sys/fs/cgroup/pids/kubepods/pod"$uid"/pids.max 2>/dev/null | head -n 1)
[ "$pids" = "$PODVM_KUBE_POD_PIDS_LIMIT" ] || fail "pod's pids.max: $pids, want $PODVM_KUBE_POD_PIDS_LIMIT"
ok "limits: memory $mem, CPU quota $cpu/100000, pod's pids.max $pids"

# 5. NetworkPolicy: under a deny-all policy, a connection from the pod to a
# listener of ours on the node, at the bridge's address.
port=17999
ss -Hltn "sport = :$port" | grep -q . && fail "port $port is in use on this host"
timeout 20 busybox nc -l -p $port </dev/null >/dev/null 2>&1 &
listener=$!
k apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: smoke-deny-all}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
EOF
sleep 1
if k exec smoke-exec -- nc -w 3 "$PODVM_KUBE_POD_GATEWAY" $port -e true 2>/dev/null; then
	[ "$PODVM_KUBE_NETWORKPOLICY" = unenforced ] || fail "PODVM_KUBE_NETWORKPOLICY=$PODVM_KUBE_NETWORKPOLICY"
	ok "NetworkPolicy unenforced: under deny-all the pod reaches the node at $PODVM_KUBE_POD_GATEWAY:$port"
else
	[ "$PODVM_KUBE_NETWORKPOLICY" != unenforced ] ||
		fail "the pod cannot reach $PODVM_KUBE_POD_GATEWAY:$port, yet policies are said unenforced"
	ok "NetworkPolicy enforced: under deny-all the pod cannot reach $PODVM_KUBE_POD_GATEWAY:$port"
fi
kill $listener 2>/dev/null || true
wait $listener 2>/dev/null || true

t=$(ms)
cleanup
ok "pods deleted in $(($(ms) - t)) ms"
echo "kube-smoke: passed"
