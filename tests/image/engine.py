"""The container engine the image checks drive, podman (deploy/image/build.sh builds with
it), with the build's own containers.conf."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys

import agent
from tests.helpers import REPO

IMAGE_DIR = REPO / "deploy" / "image"
BUILD = IMAGE_DIR / "build.sh"
TAG = f"gpushare-agent:{agent.__version__}"
BUILD_TIMEOUT_S = 900


def size_ceiling_mb() -> int:
    found = re.search(r"^size_ceiling_mb=(\d+)$", BUILD.read_text(), re.MULTILINE)
    assert found, "build.sh states the image's size ceiling (size_ceiling_mb=N)"
    return int(found[1])


def engine_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(IMAGE_DIR / "containers.conf")}


@functools.cache
def engine() -> tuple[str | None, str]:
    """podman, or None and why the check cannot run."""
    if os.environ.get("GPUSHARE_SKIP_IMAGE") == "1":
        return None, "GPUSHARE_SKIP_IMAGE=1: the image is not to be built here"
    name = "podman" if shutil.which("podman") else None
    if name is None:
        return None, "podman is not installed (.ci/run installs it; build.sh needs it)"
    probe = subprocess.run(
        [name, "info"], env=engine_env(), capture_output=True, text=True, timeout=60, check=False
    )
    if probe.returncode != 0:
        return None, f"{name} is installed but does not run: {probe.stderr.strip()[-300:]}"
    return name, ""


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The engine run with ``args`` (its output captured, never raising on failure)."""
    name, _ = engine()
    assert name is not None
    return subprocess.run(
        [name, *args],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def source_digest() -> str:
    out = subprocess.run(
        [sys.executable, str(IMAGE_DIR / "source_digest.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


# The simulated agent in the background and the CLI finding its socket as a user would, as
# the image's default user, with the socket inside the container.
SIM_STATUS_SCRIPT = (
    "id -u; gpushare serve --sim --on-stop quit >/tmp/serve.log 2>&1 & "
    "for i in $(seq 1 150); do "
    "  gpushare status --json >/tmp/status.json 2>/tmp/status.err && break; sleep 0.2; "
    "done; "
    "if [ -s /tmp/status.json ]; then echo =====; cat /tmp/status.json; "
    "else cat /tmp/status.err /tmp/serve.log; exit 1; fi"
)


def sim_status(image: str) -> tuple[str, dict[str, object]]:
    """The uid ``gpushare serve --sim`` ran as in ``image``, and its ``status --json``."""
    result = run("run", "--rm", "--network=none", "--entrypoint", "/bin/sh", image, "-c",
                 SIM_STATUS_SCRIPT)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    uid, _, answer = result.stdout.partition("=====\n")
    status: dict[str, object] = json.loads(answer)
    return uid.strip(), status
