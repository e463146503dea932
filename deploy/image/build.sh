#!/usr/bin/env bash
# Build the agent's OCI image, gpushare-agent:<version>, from Debian packages and locked
# wheels, with podman (or docker where podman is missing). See README.md beside this file.
#
#   deploy/image/build.sh [--with-mps] [--reuse-base] [--tag NAME:TAG]
#
#   --with-mps    also install Debian non-free nvidia-cuda-mps into the image (off by default:
#                 on a GPU node the NVIDIA container runtime mounts the host driver's MPS
#                 binaries, which always match the running driver)
#   --reuse-base  keep an already imported base image of the same release instead of
#                 running mmdebstrap again
#
# Steps: (1) mmdebstrap a minbase Debian rootfs of the host's own release from the host's
# own configured apt sources (apt_sources.py: no archive host is named here) into a
# tarball and import it as localhost/gpushare-base:<release>; (2) build this checkout's
# wheel and download the locked wheels (requirements.lock, hashes required); (3) build
# Containerfile on that base with no network. Needs root for mmdebstrap's root mode (or
# uidmap for its unshare mode). Prints the build time and the image size at the end.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
started=$SECONDS
# The size the image check (tests/image/test_image.py) holds the default image under.
size_ceiling_mb=500

with_mps=0
reuse_base=0
tag=""
while (($#)); do
  case "$1" in
    --with-mps) with_mps=1 ;;
    --reuse-base) reuse_base=1 ;;
    --tag) tag="$2"; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/agent/__init__.py")"
[[ -n "$version" ]] || { echo "build.sh: no __version__ in agent/__init__.py" >&2; exit 1; }
tag="${tag:-gpushare-agent:$version}"

# The build's own containers.conf (default_ulimits = [] for Debian's podman 4.3 and runc).
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
if command -v podman >/dev/null 2>&1; then
  engine=podman
elif command -v docker >/dev/null 2>&1; then
  engine=docker
else
  echo "build.sh: neither podman nor docker is installed" >&2
  exit 1
fi
command -v mmdebstrap >/dev/null 2>&1 || { echo "build.sh: mmdebstrap is not installed" >&2; exit 1; }

# shellcheck disable=SC1091
release="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
[[ -n "$release" ]] || { echo "build.sh: no VERSION_CODENAME in /etc/os-release" >&2; exit 1; }
base="localhost/gpushare-base:$release"
if ((with_mps)); then
  base="$base-mps"
fi

work="$(mktemp -d "${TMPDIR:-/var/tmp}/gpushare-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
python="${PYTHON:-python3}"

# (1) The base: a minbase rootfs, no docs, man pages or locales (copyright files kept).
if ((reuse_base)) && "$engine" image inspect "$base" >/dev/null 2>&1; then
  echo "== base $base (reused)"
else
  echo "== base $base: mmdebstrap $release"
  "$python" "$here/apt_sources.py" /etc/apt > "$work/debian.sources"
  packages="python3,python3-venv,ca-certificates"
  if ((with_mps)); then
    packages="$packages,nvidia-cuda-mps"
  fi
  # shellcheck disable=SC2016  # "$1" is the hook's own argument, expanded by mmdebstrap
  mmdebstrap --quiet --variant=minbase \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --include="$packages" \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    "$release" "$work/rootfs.tar" "$work/debian.sources"
  "$engine" import --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$base" >/dev/null
  rm -f "$work/rootfs.tar"
fi
debian_version="$("$engine" run --rm --network=none "$base" cat /etc/debian_version)"
py_version="$("$engine" run --rm --network=none "$base" \
  python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# What goes into the image, taken before it is copied (a later edit makes it stale, never
# the other way round).
digest="$("$python" "$here/source_digest.py")"

# (2) The build context: the lock, its wheels for the base's Python (hashes checked here
# and again in the build) and this checkout's own wheel, built from a copy of its sources.
echo "== wheels (Python $py_version)"
mkdir -p "$work/context/wheels" "$work/context/project" "$work/src"
cp "$here/requirements.lock" "$work/context/requirements.lock"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$py_version" --require-hashes -r "$here/requirements.lock" \
  -d "$work/context/wheels"
cp -r "$repo/pyproject.toml" "$repo/README.md" "$repo/agent" "$work/src/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
  -w "$work/context/project" "$work/src"

# (3) The image, with no network, labelled with that digest.
echo "== image $tag"
# podman: the base is local, and no intermediate images are kept. docker's --pull only forces
# a pull, and it has no --layers; a local base is used as it is.
engine_args=(--pull=never --layers=false)
if [[ "$engine" == docker ]]; then
  engine_args=()
fi
"$engine" build --network=none "${engine_args[@]}" \
  --build-arg BASE="$base" --build-arg VERSION="$version" \
  --build-arg DEBIAN_RELEASE="$release ($debian_version)" \
  --label gpushare.source-digest="$digest" --label gpushare.with-mps="$with_mps" \
  -f "$here/Containerfile" -t "$tag" "$work/context"

# The venv stage's image and earlier builds' untagged images are of no further use.
for label in gpushare.stage=venv gpushare.image=agent; do
  "$engine" image prune --force --filter "label=$label" >/dev/null || true
done
size="$("$engine" image inspect --format '{{.Size}}' "$tag")"
echo "== built $tag on Debian $release ($debian_version) in $((SECONDS - started)) s;" \
  "image size $((size / 1000000)) MB ($size bytes; ceiling $size_ceiling_mb MB)"
