#!/usr/bin/env bash
# Deletes the kind cluster of up.sh (GPUSHARE_KIND_CLUSTER, default gpushare) and all in
# it. The agent image stays in docker (`docker image rm gpushare-agent:0.1.0` removes it).
set -euo pipefail

CLUSTER=${GPUSHARE_KIND_CLUSTER:-gpushare}
command -v kind >/dev/null 2>&1 || {
    echo "down.sh: kind is not installed" >&2
    exit 1
}
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    kind delete cluster --name "$CLUSTER"
else
    echo "down.sh: no kind cluster named $CLUSTER"
fi
