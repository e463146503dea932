"""The session's check for processes left behind finds one, and only the suite's."""

from __future__ import annotations

import os
import subprocess

from tests import leftovers


def test_a_process_of_the_session_left_running_is_found_and_another_is_not() -> None:
    before = leftovers.snapshot()
    ours = subprocess.Popen(["sleep", "infinity"])
    stranger_env = {k: v for k, v in os.environ.items() if k != leftovers.SESSION_VAR}
    stranger = subprocess.Popen(["sleep", "infinity"], env=stranger_env)
    try:
        found = leftovers.left_behind(before, grace_s=0.5)
        assert [line.split(":")[0] for line in found] == [str(ours.pid)]
        assert "sleep infinity" in found[0]
    finally:
        for process in (ours, stranger):
            process.kill()
            process.wait()
    assert leftovers.left_behind(before, grace_s=0.5) == []
