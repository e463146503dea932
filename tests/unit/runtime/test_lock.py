import os
from pathlib import Path

import pytest

from agent.core.errors import AlreadyRunningError
from agent.runtime.lock import InstanceLock


def test_second_holder_is_refused_with_the_first_pid(tmp_path: Path) -> None:
    socket = str(tmp_path / "agent.sock")
    first = InstanceLock(socket)
    first.acquire()
    try:
        with pytest.raises(AlreadyRunningError, match=f"pid {os.getpid()}"):
            InstanceLock(socket).acquire()
    finally:
        first.release()
    second = InstanceLock(socket)
    second.acquire()  # free again once released
    second.release()


def test_stale_socket_is_removed_only_by_the_holder(tmp_path: Path) -> None:
    socket = tmp_path / "agent.sock"
    socket.write_text("left by a crashed agent")
    holder = InstanceLock(str(socket))
    holder.acquire()
    assert not socket.exists()
    socket.write_text("the holder's live socket")
    with pytest.raises(AlreadyRunningError):
        InstanceLock(str(socket)).acquire()
    assert socket.exists(), "a refused agent must not remove the live socket"
    holder.release()
    assert not socket.exists()
    holder.release()  # idempotent
