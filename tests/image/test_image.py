"""The agent's container image (deploy/image/build.sh), built for real and run.

Uses the image that .ci/run built when its gpushare.source-digest label matches this
checkout, and builds it otherwise (the ``image`` fixture, conftest.py). Skips with a reason
where no container engine runs, where mmdebstrap is missing, or when GPUSHARE_SKIP_IMAGE=1
says not to build. What the MPS host sets up in it: test_mps_shm.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import agent
from tests.helpers import REPO
from tests.image.engine import BUILD, BUILD_TIMEOUT_S, IMAGE_DIR, run, sim_status, size_ceiling_mb

pytestmark = [pytest.mark.image, pytest.mark.timeout(BUILD_TIMEOUT_S + 120)]


def test_the_image_prints_the_agents_version(image: str) -> None:
    result = run("run", "--rm", "--network=none", image, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"gpushare, version {agent.__version__}"


def test_the_simulated_agent_answers_status_over_its_socket_in_the_container(
    image: str,
) -> None:
    uid, status = sim_status(image)
    assert uid == "2000"  # not root by default
    assert status["simulated"] is True
    assert status["agent_version"] == agent.__version__
    assert len(status["devices"]) == 4  # type: ignore[arg-type]


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
        "python3 -c 'import pip' 2>/dev/null && echo has pip; "
        # the build's own files and the wheels' mount point (/mnt, empty in the base)
        "for d in /build /wheels; do [ -e $d ] && echo has build file $d; done; "
        "find /mnt -mindepth 1 | sed 's/^/has build file /'; true"
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


def test_the_image_carries_its_version_and_base_and_runs_unprivileged(image: str) -> None:
    result = run("image", "inspect", "--format", "{{json .Config}}", image)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    assert config["User"] == "2000:2000"
    assert config["Entrypoint"] == ["gpushare"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == agent.__version__
    # build.sh's labels: the Debian point release, in place of the local base's tag
    point = run("run", "--rm", "--network=none", "--entrypoint", "cat", image,
                "/etc/debian_version")  # fmt: skip
    base = labels["org.opencontainers.image.base.name"]
    assert re.fullmatch(rf"debian:[a-z]+ \({re.escape(point.stdout.strip())}\) \(.+\)", base)
    assert labels["gpushare.with-mps"] in ("0", "1")
    assert "gpushare.stage" not in labels  # the build stage's label stays with it


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
