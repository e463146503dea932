"""The MPS host gives the shared shared-memory directory /dev/shm's mode: a hostPath is
made 0755 root by the kubelet, where non-root MPS clients cannot make their segments."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from agent.runtime.mpshost import SHM_MODE, open_shared_shm


def test_a_closed_directory_is_opened_to_every_user_once(tmp_path: Path) -> None:
    shared = tmp_path / "shm"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    assert open_shared_shm(str(shared)) is True
    assert shared.stat().st_mode & 0o7777 == SHM_MODE
    assert open_shared_shm(str(shared)) is False, "already open: nothing to do"


def test_a_missing_directory_is_told_not_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agent.runtime.mpshost"):
        assert open_shared_shm(str(tmp_path / "none")) is False
    assert "stays as it is" in caplog.text
    assert not (tmp_path / "none").exists()
