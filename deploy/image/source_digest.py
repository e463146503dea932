#!/usr/bin/env python3
"""Print the sha256 of what goes into the agent's image: the project's sources and package
data, pyproject.toml, README.md and the build's own files (the Dockerfile, the context's
.dockerignore, the locks, this folder's scripts). build.sh labels the image
with it (gpushare.source-digest); the image check reuses an image only when its label
matches, so a stale image is never tested in place of this checkout."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_FILES = (
    "daemonset/Dockerfile",
    ".dockerignore",
    "deploy/image/requirements.lock",
    "deploy/image/build-requirements.lock",
    "deploy/image/build.sh",
    "deploy/image/apt_sources.py",
)


def inputs(repo: Path = REPO) -> list[Path]:
    files = [repo / "pyproject.toml", repo / "README.md"]
    files += sorted(
        p for p in (repo / "agent").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    files += [repo / name for name in BUILD_FILES]
    return files


def digest(repo: Path = REPO) -> str:
    h = hashlib.sha256()
    for path in inputs(repo):
        h.update(str(path.relative_to(repo)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


if __name__ == "__main__":
    sys.stdout.write(digest() + "\n")
