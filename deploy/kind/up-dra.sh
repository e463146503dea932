#!/usr/bin/env bash
# The manual end-to-end check of the DRA driver mode (deploy/dra/, deploy/kind/README.md):
# a local kind cluster of Kubernetes 1.36 whose workers are simulated GPU nodes
# (`gpushare serve --sim`) with the agents as the DRA driver gpushare.io, then the two
# example pods of deploy/dra/example.yaml (a claim from a template, and `gpushare.io/gpu:
# 1` in the limits), whose containers print the environment their share gave them.
#
# Needs: docker (a running engine), kind, kubectl, openssl; run from anywhere:
#   deploy/kind/up-dra.sh                                   # make (or reuse), deploy, run
#   GPUSHARE_KIND_CLUSTER=gpushare-dra deploy/kind/down.sh  # delete the cluster
# Settings (environment): GPUSHARE_KIND_CLUSTER (default gpushare-dra, apart from up.sh's),
# KIND_NODE_IMAGE (default kindest/node:v1.36.0; 1.34 or later serves resource.k8s.io/v1).
#
# No gpushare scheduler, extender or webhook: claims are allocated by the default
# kube-scheduler from the agents' ResourceSlices. The agents keep the shipped mutual TLS
# and token on their TCP listener (nothing calls it here): this script makes the CA, their
# certificate and a random token with openssl, as up.sh does.
set -euo pipefail

die() {
    printf 'up-dra.sh: %s\n' "$*" >&2
    exit 1
}
say() {
    printf '\n== %s\n' "$*"
}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DRA="$REPO/deploy/dra"
CLUSTER=${GPUSHARE_KIND_CLUSTER:-gpushare-dra}
CONTEXT="kind-$CLUSTER"
NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.36.0}
NAMESPACE=gpushare-system
DEMO_NAMESPACE=gpushare-demo
DEMO_PODS=(dra-claim-demo dra-extended-demo)
DRIVER=gpushare.io

for tool in docker kind kubectl openssl; do
    command -v "$tool" >/dev/null 2>&1 ||
        die "$tool is not installed (needed: docker, kind, kubectl, openssl)"
done
docker info >/dev/null 2>&1 ||
    die "docker cannot reach its engine: start it (or check your permissions on its socket)"

image_of() { # FILE: the first container image named in FILE
    sed -n 's/^[[:space:]]*image:[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$1" | head -n 1
}
AGENT_IMAGE=$(image_of "$REPO/daemonset/daemonset.yaml")
[[ -n $AGENT_IMAGE ]] || die "cannot read the agent's image from daemonset/daemonset.yaml"

k() {
    kubectl --context "$CONTEXT" "$@"
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# -- the cluster --------------------------------------------------------------------------

say "kind cluster $CLUSTER ($NODE_IMAGE, DRA feature gates of kind-config-dra.yaml)"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    echo "exists: reusing it"
else
    kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" \
        --config "$HERE/kind-config-dra.yaml" --wait 120s
fi
k api-resources --api-group=resource.k8s.io -o name | grep -qx 'deviceclasses.resource.k8s.io' ||
    die "the cluster does not serve resource.k8s.io (DRA): use a node image of 1.34 or later"

say "agent image $AGENT_IMAGE (daemonset/Dockerfile)"
docker build -f "$REPO/daemonset/Dockerfile" -t "$AGENT_IMAGE" "$REPO"
kind load docker-image "$AGENT_IMAGE" --name "$CLUSTER"

say "the workers as simulated GPU nodes"
mapfile -t WORKERS < <(k get nodes -l '!node-role.kubernetes.io/control-plane' \
    -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
((${#WORKERS[@]} > 0)) || die "the cluster has no worker node"
k label node "${WORKERS[@]}" nvidia.com/gpu.present=true --overwrite

# -- the agents' certificate and token ----------------------------------------------------

say "certificates (a CA of this run, 30 days) and the agents' token"
openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$WORK/ca.key" -out "$WORK/ca.crt" -days 30 -subj "/CN=gpushare kind CA" \
    -addext "basicConstraints = critical, CA:TRUE" \
    -addext "keyUsage = critical, keyCertSign, cRLSign" 2>/dev/null
{
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature, keyEncipherment"
    echo "extendedKeyUsage = serverAuth"
    echo "subjectAltName = DNS:gpushare-agent.$NAMESPACE.svc,DNS:*.gpushare-agent.$NAMESPACE.svc"
} >"$WORK/agent.ext"
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$WORK/agent.key" -out "$WORK/agent.csr" -subj "/CN=gpushare-agent" 2>/dev/null
openssl x509 -req -in "$WORK/agent.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" \
    -CAcreateserial -days 30 -extfile "$WORK/agent.ext" -out "$WORK/agent.crt" 2>/dev/null
openssl verify -CAfile "$WORK/ca.crt" "$WORK/agent.crt" >/dev/null ||
    die "the agent certificate does not verify"
# The binding-answer controller's client certificate towards the agents (mutual TLS).
{
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature"
    echo "extendedKeyUsage = clientAuth"
} >"$WORK/controller.ext"
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$WORK/controller.key" -out "$WORK/controller.csr" \
    -subj "/CN=gpushare-dra-controller" 2>/dev/null
openssl x509 -req -in "$WORK/controller.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" \
    -CAcreateserial -days 30 -extfile "$WORK/controller.ext" -out "$WORK/controller.crt" \
    2>/dev/null
# 256 random bits, base64: over the agent's 128-bit floor.
head -c 32 /dev/urandom | base64 | tr -d '\n' >"$WORK/token"

# -- the driver -----------------------------------------------------------------------------

existed=false
if k -n "$NAMESPACE" get daemonset/gpushare-agent >/dev/null 2>&1; then existed=true; fi

say "the agents as the DRA driver $DRIVER (daemonset/ with deploy/dra/ and the kind files)"
k apply -f "$REPO/daemonset/namespace.yaml"
secret() { # NAME FILE...: a generic secret, created or replaced
    local name=$1
    shift
    k -n "$NAMESPACE" create secret generic "$name" "$@" --dry-run=client -o yaml | k apply -f -
}
secret gpushare-agent-tls --from-file=tls.crt="$WORK/agent.crt" \
    --from-file=tls.key="$WORK/agent.key" --from-file=ca.crt="$WORK/ca.crt"
secret gpushare-agent-token --from-file=token="$WORK/token"
secret gpushare-dra-controller-agent-tls --from-file=tls.crt="$WORK/controller.crt" \
    --from-file=tls.key="$WORK/controller.key" --from-file=ca.crt="$WORK/ca.crt"
# Not applied: daemonset/configmap.yaml and deploy/dra/agent-config.yaml (the kind one,
# agent-config-dra.yaml, instead), secret.yaml and certificate.yaml (the secrets above),
# mps-host.yaml (a simulated node's agent runs its own fake daemons), and
# deploy/dra/controller-certificate.yaml (the controller's secret above).
k apply -f "$REPO/daemonset/rbac.yaml" -f "$REPO/daemonset/service.yaml" \
    -f "$REPO/daemonset/networkpolicy.yaml" -f "$HERE/agent-config-dra.yaml"
k apply -f "$DRA/rbac.yaml" -f "$DRA/slice-policy.yaml" -f "$DRA/deviceclass.yaml"
# The binding-answer controller (the scheduler waits for its answers before it binds).
k apply -f "$DRA/controller.yaml"
# The simulated node's patch first (it names list entries by position), then the DRA one.
kubectl patch --local -f "$REPO/daemonset/daemonset.yaml" --type=json \
    --patch-file "$HERE/agent-daemonset-patch.yaml" -o yaml >"$WORK/daemonset-sim.yaml"
kubectl patch --local -f "$WORK/daemonset-sim.yaml" --type=strategic \
    --patch-file "$DRA/daemonset-patch.yaml" -o yaml >"$WORK/daemonset.yaml"
k apply -f "$WORK/daemonset.yaml"
if $existed; then
    say "new certificate and token: restarting the agents"
    k -n "$NAMESPACE" rollout restart daemonset/gpushare-agent
fi
k -n "$NAMESPACE" rollout status daemonset/gpushare-agent --timeout=300s
if $existed; then k -n "$NAMESPACE" rollout restart deployment/gpushare-dra-controller; fi
k -n "$NAMESPACE" rollout status deployment/gpushare-dra-controller --timeout=300s

say "waiting for each worker's ResourceSlice of driver $DRIVER"
for node in "${WORKERS[@]}"; do
    for ((i = 0; ; i++)); do
        devices=$(k get resourceslices --field-selector "spec.driver=$DRIVER,spec.nodeName=$node" \
            -o jsonpath='{range .items[*]}{range .spec.devices[*]}{.name}{" "}{end}{end}')
        if [[ -n $devices ]]; then
            echo "$node: $devices"
            break
        fi
        ((i < 60)) || die "$node has no ResourceSlice of $DRIVER after 120 s: see
  kubectl --context $CONTEXT -n $NAMESPACE logs -l app.kubernetes.io/name=gpushare-agent"
        sleep 2
    done
done

# -- the example pods ---------------------------------------------------------------------

say "the example pods (deploy/dra/example.yaml)"
for pod in "${DEMO_PODS[@]}"; do
    k -n "$DEMO_NAMESPACE" delete pod "$pod" --ignore-not-found --wait=true >/dev/null 2>&1 || true
done
k apply -f "$DRA/example.yaml"
for pod in "${DEMO_PODS[@]}"; do
    if ! k -n "$DEMO_NAMESPACE" wait --for=condition=Ready "pod/$pod" --timeout=180s; then
        echo "pod $pod is not running; what it and the agents say:" >&2
        k -n "$DEMO_NAMESPACE" describe pod "$pod" >&2 || true
        k -n "$DEMO_NAMESPACE" get resourceclaims -o yaml >&2 || true
        k -n "$NAMESPACE" logs -l app.kubernetes.io/name=gpushare-agent --prefix --tail=50 >&2 || true
        die "the example pod $pod did not start"
    fi
done

claim_of() { # POD: the name of the claim its share came from
    local name
    name=$(k -n "$DEMO_NAMESPACE" get pod "$1" \
        -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
    if [[ -z $name ]]; then
        name=$(k -n "$DEMO_NAMESPACE" get pod "$1" \
            -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}')
    fi
    printf '%s\n' "$name"
}

for pod in "${DEMO_PODS[@]}"; do
    node=$(k -n "$DEMO_NAMESPACE" get pod "$pod" -o jsonpath='{.spec.nodeName}')
    claim=$(claim_of "$pod")
    [[ -n $claim ]] || die "pod $pod names no ResourceClaim in its status"
    uid=$(k -n "$DEMO_NAMESPACE" get resourceclaim "$claim" -o jsonpath='{.metadata.uid}')

    say "$pod on $node: claim $claim ($uid)"
    k -n "$DEMO_NAMESPACE" get resourceclaim "$claim" -o jsonpath='allocated: {range .status.allocation.devices.results[*]}{.pool}/{.device} share {.shareID} consumed {.consumedCapacity}{"\n"}{end}status: {range .status.devices[*]}{.device} {range .conditions[*]}{.type}={.status} ({.reason}) {end}{"\n"}{end}'

    say "kubectl -n $DEMO_NAMESPACE logs $pod (the environment its share gave it)"
    k -n "$DEMO_NAMESPACE" logs "$pod"

    say "the CDI spec on $node: /var/run/cdi/$DRIVER-claim_$uid.json"
    docker exec "$node" cat "/var/run/cdi/$DRIVER-claim_$uid.json" || echo "(not there)"
    echo

    say "the leases on the agent of $node"
    agent=$(k -n "$NAMESPACE" get pod -l app.kubernetes.io/name=gpushare-agent \
        --field-selector "spec.nodeName=$node" -o jsonpath='{.items[0].metadata.name}')
    k -n "$NAMESPACE" exec "$agent" -- gpushare leases || true
done

cat <<EOF

Expected, for each pod: a result on gpu-<n> of its node's pool with a shareID, consumed
memory 20Gi and threads 25 (dra-claim-demo) or 8Gi and 25 (dra-extended-demo, the
class's default), clients 1; status.devices with gpushare.io/admitted=True (Admitted);
its log showing CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25,
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<index>=20480M (or 8192M), CUDA_VISIBLE_DEVICES and
GPUSHARE_LEASE_ID, the same as the containerEdits.env of its CDI spec, and that lease in
\`gpushare leases\` on its node. Then delete the pods and check that the leases and the
CDI specs are gone:
  kubectl --context $CONTEXT -n $DEMO_NAMESPACE delete pod ${DEMO_PODS[*]}
  kubectl --context $CONTEXT get resourceslices -o yaml
Tear down: GPUSHARE_KIND_CLUSTER=$CLUSTER $HERE/down.sh
EOF
