#!/usr/bin/env bash
# The manual end-to-end check of docs/kubernetes.md: the whole Kubernetes integration on a
# local kind cluster whose workers are simulated GPU nodes (`gpushare serve --sim`), then
# one pod asking for a share, whose container prints the environment its lease gave it.
#
# Needs: docker (a running engine), kind, kubectl, openssl; run from anywhere:
#   deploy/kind/up.sh          # make (or reuse) the cluster, build, deploy, run the pod
#   deploy/kind/down.sh        # delete the cluster
# Settings (environment): GPUSHARE_KIND_CLUSTER (default gpushare), KIND_NODE_IMAGE
# (default: kindest/node at the version of the kube-scheduler image in
# deploy/scheduler.yaml, so the second scheduler matches the control plane).
#
# Security is the shipped one, not a weaker kind-only mode: the agents' TCP listener
# requires mutual TLS and a bearer token, and `kube serve` connects with both. There is no
# cert-manager here, so this script is the CA: it makes a CA, the agents' serving
# certificate, the cluster side's client certificate and the webhook's certificate with
# openssl, a random token, and puts the CA into the webhook configurations' caBundle.
# `kube serve` reaches each agent at its pod IP (from the EndpointSlices) and checks the
# certificate against that IP, so the agents' certificate names every address of the
# workers' pod ranges (a kind-only shortcut; see docs/kubernetes.md, "What is not built").
set -euo pipefail

die() {
    printf 'up.sh: %s\n' "$*" >&2
    exit 1
}
say() {
    printf '\n== %s\n' "$*"
}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CLUSTER=${GPUSHARE_KIND_CLUSTER:-gpushare}
CONTEXT="kind-$CLUSTER"
NAMESPACE=gpushare-system
DEMO_NAMESPACE=gpushare-demo
DEMO_POD=share-demo

for tool in docker kind kubectl openssl; do
    command -v "$tool" >/dev/null 2>&1 ||
        die "$tool is not installed (needed: docker, kind, kubectl, openssl)"
done
docker info >/dev/null 2>&1 ||
    die "docker cannot reach its engine: start it (or check your permissions on its socket)"

# The images, each written once in the manifests.
image_of() { # FILE: the first container image named in FILE
    sed -n 's/^[[:space:]]*image:[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$1" | head -n 1
}
AGENT_IMAGE=$(image_of "$REPO/daemonset/daemonset.yaml")
SCHEDULER_IMAGE=$(image_of "$REPO/deploy/scheduler.yaml")
[[ -n $AGENT_IMAGE && -n $SCHEDULER_IMAGE ]] || die "cannot read the images from the manifests"
NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:${SCHEDULER_IMAGE##*:}}

k() {
    kubectl --context "$CONTEXT" "$@"
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# -- the cluster --------------------------------------------------------------------------

say "kind cluster $CLUSTER ($NODE_IMAGE)"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    echo "exists: reusing it"
else
    kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" \
        --config "$HERE/kind-config.yaml" --wait 120s
fi

say "agent image $AGENT_IMAGE (daemonset/Dockerfile)"
docker build -f "$REPO/daemonset/Dockerfile" -t "$AGENT_IMAGE" "$REPO"
kind load docker-image "$AGENT_IMAGE" --name "$CLUSTER"

say "the workers as simulated GPU nodes"
mapfile -t WORKERS < <(k get nodes -l '!node-role.kubernetes.io/control-plane' \
    -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
((${#WORKERS[@]} > 0)) || die "the cluster has no worker node"
k label node "${WORKERS[@]}" nvidia.com/gpu.present=true --overwrite

# -- certificates and token ---------------------------------------------------------------

cidr_addresses() { # 10.244.1.0/24 -> IP:10.244.1.1 ... IP:10.244.1.254, one per line
    local cidr=$1 a b c d
    local ip=${cidr%/*} bits=${cidr#*/}
    [[ $ip =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ && $bits =~ ^[0-9]+$ ]] ||
        die "pod range $cidr is not IPv4 (this script handles IPv4 kind clusters only)"
    ((bits >= 20 && bits <= 30)) || die "pod range $cidr: expected a /20 to /30 per node"
    IFS=. read -r a b c d <<<"$ip"
    local base=$(((a << 24) | (b << 16) | (c << 8) | d)) size=$((1 << (32 - bits))) n v
    for ((n = 1; n < size - 1; n++)); do
        v=$((base + n))
        printf 'IP:%d.%d.%d.%d\n' $((v >> 24 & 255)) $((v >> 16 & 255)) $((v >> 8 & 255)) $((v & 255))
    done
}

leaf() { # NAME CN USAGE SANS: NAME.key and NAME.crt signed by the CA
    local name=$1 cn=$2 usage=$3 sans=$4
    {
        echo "basicConstraints = critical, CA:FALSE"
        echo "keyUsage = critical, digitalSignature, keyEncipherment"
        echo "extendedKeyUsage = $usage"
        if [[ -n $sans ]]; then echo "subjectAltName = $sans"; fi
    } >"$WORK/$name.ext"
    openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
        -keyout "$WORK/$name.key" -out "$WORK/$name.csr" -subj "/CN=$cn" 2>/dev/null
    openssl x509 -req -in "$WORK/$name.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" \
        -CAcreateserial -days 30 -extfile "$WORK/$name.ext" -out "$WORK/$name.crt" 2>/dev/null
    openssl verify -CAfile "$WORK/ca.crt" "$WORK/$name.crt" >/dev/null ||
        die "the $name certificate does not verify"
}

say "certificates (a CA of this run, 30 days) and the agents' token"
openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$WORK/ca.key" -out "$WORK/ca.crt" -days 30 -subj "/CN=gpushare kind CA" \
    -addext "basicConstraints = critical, CA:TRUE" \
    -addext "keyUsage = critical, keyCertSign, cRLSign" 2>/dev/null
agent_sans="DNS:gpushare-agent.$NAMESPACE.svc,DNS:*.gpushare-agent.$NAMESPACE.svc"
for node in "${WORKERS[@]}"; do
    cidr=$(k get node "$node" -o jsonpath='{.spec.podCIDR}')
    [[ -n $cidr ]] || die "node $node has no pod range (spec.podCIDR)"
    agent_sans+=,$(cidr_addresses "$cidr" | paste -sd, -)
done
leaf agent gpushare-agent serverAuth "$agent_sans"
leaf scheduler gpushare-scheduler clientAuth ""
leaf webhook gpushare-webhook.$NAMESPACE.svc serverAuth "DNS:gpushare-webhook.$NAMESPACE.svc"
# 256 random bits, base64: over the agent's 128-bit floor.
head -c 32 /dev/urandom | base64 | tr -d '\n' >"$WORK/token"

# -- the agents ---------------------------------------------------------------------------

existed=false
if k -n "$NAMESPACE" get daemonset/gpushare-agent >/dev/null 2>&1; then existed=true; fi

say "the agents (daemonset/, with the kind configuration of deploy/kind/)"
k apply -f "$REPO/daemonset/namespace.yaml"
secret() { # NAME FILE...: a generic secret, created or replaced
    local name=$1
    shift
    k -n "$NAMESPACE" create secret generic "$name" "$@" --dry-run=client -o yaml | k apply -f -
}
secret gpushare-agent-tls --from-file=tls.crt="$WORK/agent.crt" \
    --from-file=tls.key="$WORK/agent.key" --from-file=ca.crt="$WORK/ca.crt"
secret gpushare-agent-token --from-file=token="$WORK/token"
secret gpushare-scheduler-agent-tls --from-file=tls.crt="$WORK/scheduler.crt" \
    --from-file=tls.key="$WORK/scheduler.key" --from-file=ca.crt="$WORK/ca.crt"
secret gpushare-webhook-tls --from-file=tls.crt="$WORK/webhook.crt" \
    --from-file=tls.key="$WORK/webhook.key" --from-file=ca.crt="$WORK/ca.crt"
# Not applied: configmap.yaml (agent-config.yaml instead), secret.yaml and certificate.yaml
# (the secrets above), mps-host.yaml (a simulated node's agent runs its own fake daemons).
k apply -f "$REPO/daemonset/rbac.yaml" -f "$REPO/daemonset/service.yaml" \
    -f "$REPO/daemonset/networkpolicy.yaml" -f "$HERE/agent-config.yaml"
kubectl patch --local -f "$REPO/daemonset/daemonset.yaml" --type=json \
    --patch-file "$HERE/agent-daemonset-patch.yaml" -o yaml >"$WORK/daemonset.yaml"
k apply -f "$WORK/daemonset.yaml"

say "the cluster side (deploy/, without certificates.yaml and issuer.yaml: no cert-manager)"
k apply -f "$REPO/deploy/rbac.yaml" -f "$REPO/deploy/scheduler.yaml" \
    -f "$REPO/deploy/webhook.yaml" -f "$REPO/deploy/networkpolicy.yaml"
ca_bundle=$(base64 <"$WORK/ca.crt" | tr -d '\n')
for kind in mutatingwebhookconfiguration validatingwebhookconfiguration; do
    k patch "$kind" gpushare --type=json \
        -p "[{\"op\": \"add\", \"path\": \"/webhooks/0/clientConfig/caBundle\", \"value\": \"$ca_bundle\"}]"
done

if $existed; then
    say "new certificates and token: restarting the agents and the scheduler"
    k -n "$NAMESPACE" rollout restart daemonset/gpushare-agent deployment/gpushare-scheduler
fi

say "waiting for the rollouts"
k -n "$NAMESPACE" rollout status daemonset/gpushare-agent --timeout=300s
k -n "$NAMESPACE" rollout status deployment/gpushare-scheduler --timeout=300s

say "waiting for the workers to advertise gpushare.io/share (the agents' device plugin)"
for node in "${WORKERS[@]}"; do
    for ((i = 0; ; i++)); do
        units=$(k get node "$node" -o jsonpath='{.status.allocatable.gpushare\.io/share}')
        if [[ -n $units && $units != 0 ]]; then
            echo "$node: gpushare.io/share $units"
            break
        fi
        ((i < 60)) || die "$node does not advertise gpushare.io/share after 120 s: see
  kubectl --context $CONTEXT -n $NAMESPACE logs -l app.kubernetes.io/name=gpushare-agent"
        sleep 2
    done
done

# -- the example pod ----------------------------------------------------------------------

say "the example pod (deploy/kind/example-pod.yaml)"
k -n "$DEMO_NAMESPACE" delete pod "$DEMO_POD" --ignore-not-found --wait=true >/dev/null 2>&1 || true
k apply -f "$HERE/example-pod.yaml"
if ! k -n "$DEMO_NAMESPACE" wait --for=condition=Ready "pod/$DEMO_POD" --timeout=180s; then
    echo "the pod is not running; what the parts say:" >&2
    k -n "$DEMO_NAMESPACE" describe pod "$DEMO_POD" >&2 || true
    # both replicas: each part acts in the holder of its Lease
    k -n "$NAMESPACE" logs -l app.kubernetes.io/name=gpushare-scheduler -c gpushare \
        --prefix --tail=50 >&2 || true
    k -n "$NAMESPACE" logs -l app.kubernetes.io/name=gpushare-scheduler -c kube-scheduler \
        --prefix --tail=50 >&2 || true
    die "the example pod did not start"
fi
node=$(k -n "$DEMO_NAMESPACE" get pod "$DEMO_POD" -o jsonpath='{.spec.nodeName}')
lease=$(k -n "$DEMO_NAMESPACE" get pod "$DEMO_POD" \
    -o jsonpath='{.metadata.annotations.gpushare\.io/lease}')
echo "scheduled by $(k -n "$DEMO_NAMESPACE" get pod "$DEMO_POD" -o jsonpath='{.spec.schedulerName}') on $node, lease $lease"

say "kubectl -n $DEMO_NAMESPACE logs $DEMO_POD (the environment its lease gave it)"
sleep 2
k -n "$DEMO_NAMESPACE" logs "$DEMO_POD"

say "the lease on the agent of $node"
agent=$(k -n "$NAMESPACE" get pod -l app.kubernetes.io/name=gpushare-agent \
    --field-selector "spec.nodeName=$node" -o jsonpath='{.items[0].metadata.name}')
k -n "$NAMESPACE" exec "$agent" -- gpushare leases || true

cat <<EOF

Expected: CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25,
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M, NVIDIA_VISIBLE_DEVICES=GPU-... and
GPUSHARE_LEASE_ID=$lease above, and the same lease for pod $DEMO_NAMESPACE/$DEMO_POD in
\`gpushare leases\`. Then delete the pod and check the lease is released:
  kubectl --context $CONTEXT -n $DEMO_NAMESPACE delete pod $DEMO_POD
  kubectl --context $CONTEXT -n $NAMESPACE exec $agent -- gpushare leases
Tear down: $HERE/down.sh
EOF
