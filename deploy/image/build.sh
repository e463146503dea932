#!/usr/bin/env bash
# Build the agent's OCI image, gpushare-agent:<version>, from Debian packages and locked
# wheels, with podman, offline. See README.md beside this file.
#
#   deploy/image/build.sh [--with-mps] [--reuse-base] [--tag NAME:TAG] [--out DIR] [--save]
#
#   --with-mps    also install Debian non-free nvidia-cuda-mps into the image (off by default:
#                 on a GPU node the NVIDIA container runtime mounts the host driver's MPS
#                 binaries, which always match the running driver)
#   --reuse-base  keep an already imported base image of the same release instead of
#                 running mmdebstrap again
#   --out DIR     where the chart's package goes (default dist/ in the repository)
#   --save        also write the image there as an OCI archive (podman save)
#
# Steps: (1) mmdebstrap a minbase Debian rootfs of the host's own release from the host's
# own configured apt sources (apt_sources.py: no archive host is named here) into a
# tarball and import it as localhost/gpushare-base:<release>; (2) download the locked wheels
# (requirements.lock and build-requirements.lock, hashes required); (3) build
# daemonset/Dockerfile from this checkout on that base with no network, pip finding only
# those wheels (mounted with `podman build -v`, which docker build lacks: podman is
# required); (4) package the Helm chart into DIR (deploy/helm/package.py:
# gpushare-<version>.tgz and its OCI layout). Needs root for mmdebstrap's root mode (or
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
out="$repo/dist"
save=0
while (($#)); do
  case "$1" in
    --with-mps) with_mps=1 ;;
    --reuse-base) reuse_base=1 ;;
    --tag) tag="$2"; shift ;;
    --out) out="$2"; shift ;;
    --save) save=1 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/agent/__init__.py")"
[[ -n "$version" ]] || { echo "build.sh: no __version__ in agent/__init__.py" >&2; exit 1; }
tag="${tag:-gpushare-agent:$version}"

# The build's own containers.conf (default_ulimits = [] for Debian's podman 4.3 and runc).
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
# podman alone: the offline build mounts the wheels into it (-v), which docker build cannot;
# with docker, build daemonset/Dockerfile from an index instead (README.md).
command -v podman >/dev/null 2>&1 || {
  echo "build.sh: podman is not installed (the offline build mounts the wheels with" \
    "podman build -v; with docker, see the portable build in deploy/image/README.md)" >&2
  exit 1
}
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
if ((reuse_base)) && podman image inspect "$base" >/dev/null 2>&1; then
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
  podman import --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$base" >/dev/null
  rm -f "$work/rootfs.tar"
fi
debian_version="$(podman run --rm --network=none "$base" cat /etc/debian_version)"
py_version="$(podman run --rm --network=none "$base" \
  python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# What goes into the image, taken before it is copied (a later edit makes it stale, never
# the other way round).
digest="$("$python" "$here/source_digest.py")"

# (2) Both locks' wheels for the base's Python (hashes checked here and again in the build).
echo "== wheels (Python $py_version)"
mkdir -p "$work/wheels"
for lock in requirements.lock build-requirements.lock; do
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$py_version" --require-hashes -r "$here/$lock" -d "$work/wheels"
done

# (3) daemonset/Dockerfile, with no network: the context is this checkout (the repository's
# .dockerignore keeps it to the sources and the locks), pip finds only the mounted wheels,
# at /mnt (empty in the base: a new mount point would stay in the image as an empty
# folder). The base is local, and no intermediate images are kept. The labels given here
# replace the Dockerfile's base name (the local base's tag) with the Debian point release.
echo "== image $tag"
base_name="debian:$release ($debian_version) (mmdebstrap minbase)"
podman build --network=none --pull=never --layers=false \
  -v "$work/wheels:/mnt:ro" \
  --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/mnt \
  --build-arg BASE="$base" --build-arg VERSION="$version" \
  --label org.opencontainers.image.base.name="$base_name" \
  --label gpushare.source-digest="$digest" --label gpushare.with-mps="$with_mps" \
  -f "$repo/daemonset/Dockerfile" -t "$tag" "$repo"

# The venv stage's image and earlier builds' untagged images are of no further use.
for label in gpushare.stage=venv gpushare.image=agent; do
  podman image prune --force --filter "label=$label" >/dev/null || true
done
# (4) The chart, packaged as `helm package` and `helm push` would (no helm binary needed),
# and, with --save, the image as an OCI archive beside it.
echo "== chart package in $out"
"$python" "$repo/deploy/helm/package.py" --out "$out"
if ((save)); then
  archive="$out/${tag//[:\/]/_}.oci.tar"
  rm -f "$archive"
  podman save --format oci-archive -o "$archive" "$tag"
  echo "== saved $tag as $archive"
fi

size="$(podman image inspect --format '{{.Size}}' "$tag")"
echo "== built $tag on Debian $release ($debian_version) in $((SECONDS - started)) s;" \
  "image size $((size / 1000000)) MB ($size bytes; ceiling $size_ceiling_mb MB)"
