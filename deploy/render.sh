#!/usr/bin/env bash
# Render the plain manifests under daemonset/ and deploy/ from the Helm chart
# deploy/helm/gpushare (the one source of truth); --check only says which files differ.
# Needs the dev dependencies (pip install -e '.[dev]': helm-python-sdk, Helm's Go code
# with Python bindings; no helm binary).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
[[ -x $PYTHON ]] || PYTHON=python3
exec "$PYTHON" "$REPO/deploy/helm/render.py" "$@"
