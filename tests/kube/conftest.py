"""``root``: a short temporary directory (Unix socket paths are limited to 107 bytes) for
the agents, sockets and stores of a Kubernetes test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import short_dir


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path
