"""daemonset/Dockerfile where its normal build does not show it: that build is build.sh's
(the ``image`` fixture; test_image.py runs what it makes). Here, offline on the local
Debian base build.sh made: a wheel whose bytes differ from the lock's hash fails the build,
a base without Python and apt-get fails with the reason, and the build context holds only
what the image is made of (.dockerignore)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.image.engine import BUILD_TIMEOUT_S, IMAGE_DIR, run

# The first image check to run builds the image (the ``image`` fixture).
pytestmark = [pytest.mark.image, pytest.mark.timeout(BUILD_TIMEOUT_S + 120)]

DOCKERFILE = REPO / "daemonset" / "Dockerfile"
TAG = f"localhost/gpushare-agent-dockerfile:test-{os.getpid()}"
DOWNLOAD_TIMEOUT_S = 120


def base_image() -> str:
    """The local Debian base build.sh makes (localhost/gpushare-base:<release>)."""
    release = ""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            release = line.partition("=")[2].strip('"')
    assert release, "no VERSION_CODENAME in /etc/os-release"
    return f"localhost/gpushare-base:{release}"


def build(
    context: Path, dockerfile: Path, tag: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``dockerfile`` built with no network and no image pulled; the result removed."""
    try:
        return run("build", "--network=none", "--pull=never", "--layers=false", *extra,
                   "-f", str(dockerfile), "-t", tag, str(context),
                   timeout=BUILD_TIMEOUT_S)  # fmt: skip
    finally:
        run("rmi", "-f", tag)


def build_agent(base: str, wheels: Path) -> subprocess.CompletedProcess[str]:
    """daemonset/Dockerfile on ``base``, pip finding only ``wheels`` (as build.sh does)."""
    return build(
        REPO, DOCKERFILE, f"{TAG}-agent", "-v", f"{wheels}:/wheels:ro",
        "--build-arg", f"BASE={base}",
        "--build-arg", "PIP_NO_INDEX=1", "--build-arg", "PIP_FIND_LINKS=/wheels",
    )  # fmt: skip


def test_a_wheel_that_differs_from_its_hash_fails_the_build(image: str, tmp_path: Path) -> None:
    # build-requirements.lock's one wheel (setuptools), the build's first install: the same
    # pip options (--require-hashes) install requirements.lock's wheels after it.
    wheels = tmp_path / "wheels"
    downloaded = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--only-binary=:all:", "--python-version", "3.11", "--require-hashes",
         "-r", str(IMAGE_DIR / "build-requirements.lock"), "-d", str(wheels)],
        capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert downloaded.returncode == 0, downloaded.stderr
    (wheel,) = wheels.iterdir()
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    result = build_agent(base_image(), wheels)
    assert result.returncode != 0
    assert "DO NOT MATCH THE HASHES" in result.stdout + result.stderr, result.stderr[-2000:]
    assert wheel.name.partition("-")[0] in result.stdout + result.stderr  # named


def test_a_base_without_python_or_apt_get_fails_with_the_reason(image: str, tmp_path: Path) -> None:
    bare = tmp_path / "Dockerfile"
    bare.write_text(
        f"FROM {base_image()}\nRUN rm -f /usr/bin/python3 /usr/bin/python3.11 /usr/bin/apt-get\n"
    )
    tag = f"{TAG}-bare"
    made = run("build", "--network=none", "--pull=never", "--layers=false", "-f", str(bare),
               "-t", tag, str(tmp_path))  # fmt: skip
    try:
        assert made.returncode == 0, made.stderr[-2000:]
        result = build_agent(tag, tmp_path)
    finally:
        run("rmi", "-f", tag)
    assert result.returncode != 0
    said = "the base has no python3 that makes a venv, and no apt-get"
    assert said in result.stdout + result.stderr, result.stderr[-2000:]


def test_the_build_context_holds_only_what_the_image_is_made_of(image: str, tmp_path: Path) -> None:
    # .dockerignore at the repository root, seen by the engine itself.
    probe = tmp_path / "Dockerfile"
    probe.write_text(
        f"FROM {base_image()}\nCOPY . /context\n"
        "RUN cd /context && find . -maxdepth 3 -mindepth 1 -not -path './agent/*/*' | sort\n"
    )
    result = build(REPO, probe, f"{TAG}-context")
    assert result.returncode == 0, result.stderr[-2000:]
    listed = {line for line in result.stdout.splitlines() if line.startswith("./")}
    tops = {line.split("/")[1] for line in listed}
    assert tops == {"agent", "deploy", "pyproject.toml", "README.md"}, tops
    assert {line for line in listed if line.startswith("./deploy/")} == {
        "./deploy/image",
        "./deploy/image/requirements.lock",
        "./deploy/image/build-requirements.lock",
    }
    assert not any("__pycache__" in line for line in listed)
