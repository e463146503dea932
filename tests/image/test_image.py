"""The agent's container image (deploy/image/build.sh), built for real and run.

Uses the image that .ci/run built when its gpushare.source-digest label matches this
checkout, and builds it otherwise. Skips with a reason where no container engine runs, where
mmdebstrap is missing, or when GPUSHARE_SKIP_IMAGE=1 says not to build.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import agent
from tests.helpers import REPO

IMAGE_DIR = REPO / "deploy" / "image"
BUILD = IMAGE_DIR / "build.sh"
TAG = f"gpushare-agent:{agent.__version__}"
BUILD_TIMEOUT_S = 900

pytestmark = [pytest.mark.image, pytest.mark.timeout(BUILD_TIMEOUT_S + 120)]


def size_ceiling_mb() -> int:
    found = re.search(r"^size_ceiling_mb=(\d+)$", BUILD.read_text(), re.MULTILINE)
    assert found, "build.sh states the image's size ceiling (size_ceiling_mb=N)"
    return int(found[1])


def engine_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(IMAGE_DIR / "containers.conf")}


@functools.cache
def engine() -> tuple[str | None, str]:
    """The container engine build.sh would use, or None and why the check cannot run."""
    if os.environ.get("GPUSHARE_SKIP_IMAGE") == "1":
        return None, "GPUSHARE_SKIP_IMAGE=1: the image is not to be built here"
    name = "podman" if shutil.which("podman") else "docker" if shutil.which("docker") else None
    if name is None:
        return None, "neither podman nor docker is installed (.ci/run installs podman)"
    probe = subprocess.run(
        [name, "info"], env=engine_env(), capture_output=True, text=True, timeout=60, check=False
    )
    if probe.returncode != 0:
        return None, f"{name} is installed but does not run: {probe.stderr.strip()[-300:]}"
    return name, ""


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
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


@pytest.fixture(scope="module")
def image() -> str:
    name, reason = engine()
    if name is None:
        pytest.skip(reason)
    labels = run("image", "inspect", "--format", "{{json .Labels}}", TAG)
    current = labels.returncode == 0 and (
        (json.loads(labels.stdout) or {}).get("gpushare.source-digest") == source_digest()
    )
    if not current:
        if not shutil.which("mmdebstrap"):
            pytest.skip("mmdebstrap is not installed (.ci/run installs it): cannot build the base")
        built = subprocess.run(
            ["bash", str(BUILD), "--reuse-base"],
            env=engine_env(),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        assert built.returncode == 0, f"build.sh failed:\n{(built.stdout + built.stderr)[-4000:]}"
    return TAG


def test_the_image_prints_the_agents_version(image: str) -> None:
    result = run("run", "--rm", "--network=none", image, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"gpushare, version {agent.__version__}"


def test_the_simulated_agent_answers_status_over_its_socket_in_the_container(
    image: str,
) -> None:
    # The agent in the background, the CLI finding its socket as a user would; both as the
    # image's default (non-root) user, with the socket inside the container.
    script = (
        "id -u; gpushare serve --sim --on-stop quit >/tmp/serve.log 2>&1 & "
        "for i in $(seq 1 150); do "
        "  gpushare status --json >/tmp/status.json 2>/tmp/status.err && break; sleep 0.2; "
        "done; "
        "if [ -s /tmp/status.json ]; then echo =====; cat /tmp/status.json; "
        "else cat /tmp/status.err /tmp/serve.log; exit 1; fi"
    )
    result = run("run", "--rm", "--network=none", "--entrypoint", "/bin/sh", image, "-c", script)
    assert result.returncode == 0, result.stdout + result.stderr
    uid, _, answer = result.stdout.partition("=====\n")
    assert uid.strip() == "2000"  # not root by default
    status = json.loads(answer)
    assert status["simulated"] is True
    assert status["agent_version"] == agent.__version__
    assert len(status["devices"]) == 4


def test_the_mps_host_command_is_there(image: str) -> None:
    result = run("run", "--rm", "--network=none", image, "mps", "host", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: gpushare mps host")


def test_the_image_holds_no_compiler_pip_cache_or_docs(image: str) -> None:
    script = (
        "for tool in gcc cc c++ make pip pip3; do command -v $tool && echo has $tool; done; "
        "find /root/.cache /home/gpushare/.cache /var/cache/apt /var/lib/apt/lists -type f "
        "! -name lock 2>/dev/null | sed 's/^/has cache /'; "
        "find /usr/share/man /usr/share/info /usr/share/doc -type f ! -name copyright "
        "! -path /usr/share/info/dir 2>/dev/null | sed 's/^/has doc /'; "
        "python3 -c 'import pip' 2>/dev/null && echo has pip; true"
    )
    result = run(
        "run",
        "--rm",
        "--network=none",
        "--user",
        "0",
        "--entrypoint",
        "/bin/sh",
        image,
        "-c",
        script,
    )
    assert result.returncode == 0, result.stderr
    assert "has " not in result.stdout, result.stdout


def test_the_image_stays_under_its_size_ceiling(image: str) -> None:
    result = run("image", "inspect", "--format", "{{.Size}}", image)
    assert result.returncode == 0, result.stderr
    size_mb = int(result.stdout.strip()) / 1e6
    ceiling = size_ceiling_mb()
    assert size_mb <= ceiling, f"{image} is {size_mb:.0f} MB, over its ceiling of {ceiling} MB"


def test_the_image_carries_its_version_and_runs_unprivileged(image: str) -> None:
    result = run("image", "inspect", "--format", "{{json .Config}}", image)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    assert config["User"] == "2000:2000"
    assert config["Entrypoint"] == ["gpushare"]
    assert config["Labels"]["org.opencontainers.image.version"] == agent.__version__


def test_the_lock_pins_every_runtime_dependency_by_hash() -> None:
    # Needs no engine: the lock covers pyproject's [project] dependencies, each with hashes.
    import tomllib

    lock = (IMAGE_DIR / "requirements.lock").read_text()
    pinned = {
        m[1].lower().replace("_", "-"): m[2]
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", lock, re.MULTILINE)
    }
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pinned, f"{name} is not in deploy/image/requirements.lock"
    blocks = re.split(r"^(?=[A-Za-z0-9_.-]+==)", lock, flags=re.MULTILINE)[1:]
    assert len(blocks) == len(pinned)
    for block in blocks:
        assert "--hash=sha256:" in block, block.splitlines()[0]


def test_the_mps_binaries_are_not_in_the_default_image(image: str) -> None:
    # On a node the NVIDIA container runtime mounts the host driver's MPS binaries, which
    # match the running driver; build.sh --with-mps adds Debian's for use without one.
    result = run(
        "run",
        "--rm",
        "--network=none",
        "--entrypoint",
        "/bin/sh",
        image,
        "-c",
        "command -v nvidia-cuda-mps-control || true",
    )
    labels = run("image", "inspect", "--format", "{{json .Labels}}", image)
    with_mps = json.loads(labels.stdout).get("gpushare.with-mps") == "1"
    assert bool(result.stdout.strip()) == with_mps


def test_build_sh_is_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed")
    result = subprocess.run(
        ["shellcheck", str(BUILD)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout


def test_the_image_files_are_where_the_docs_say() -> None:
    readme = (IMAGE_DIR / "README.md").read_text()
    assert "deploy/image/build.sh" in readme
    assert f"{size_ceiling_mb()} MB" in readme
    assert Path(BUILD).stat().st_mode & 0o111, "build.sh is executable"


def test_the_image_has_what_the_mps_host_shm_init_container_runs(image: str) -> None:
    # The chart's shm init container mounts a tmpfs with the agent's image: sh, mount and
    # mountpoint (util-linux) must be there.
    script = "for tool in sh mount mountpoint; do command -v $tool || echo missing $tool; done"
    result = run("run", "--rm", "--network=none", "--entrypoint", "/bin/sh", image, "-c", script)
    assert result.returncode == 0, result.stderr
    assert "missing" not in result.stdout, result.stdout
