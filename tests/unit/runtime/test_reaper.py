"""The orphan reaper collects exited children that no one waits for, and looks at the
process table only when some child has exited."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import subprocess, sys, time
    from unittest import mock
    import psutil
    from agent.runtime import reaper

    assert not reaper.any_child_exited()  # no children at all
    with mock.patch.object(psutil.Process, "children", side_effect=AssertionError("scan")):
        assert reaper.reap_orphans() == []  # nothing exited: no scan of the process table
    running = subprocess.Popen(["sleep", "30"])
    assert not reaper.any_child_exited()
    exited = subprocess.Popen(["sh", "-c", "exit 3"])
    deadline = time.monotonic() + 10
    while not reaper.any_child_exited():
        assert time.monotonic() < deadline, "the child never showed as exited"
        time.sleep(0.01)
    assert reaper.any_child_exited()  # looking does not collect it
    assert reaper.reap_orphans() == [exited.pid]
    assert not reaper.any_child_exited()
    running.kill()
    running.wait()
    print("ok")
    """
)


def test_reaps_an_exited_child_and_scans_only_when_one_exited() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
