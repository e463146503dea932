"""Pipe and log directory access: who owns them, what refuses a start, what a probe finds."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agent.mps.limits import DaemonPaths
from agent.mps.pipes import PipeAccess, PipePermissionError, PipeWatch, resolve_access

UUID = "GPU-11111111-2222-3333-4444-555555555555"


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def watch(tmp_path: Path, gid: int | None) -> PipeWatch:
    pipes = PipeWatch(DaemonPaths(str(tmp_path / "mps"), UUID), PipeAccess(os.geteuid(), gid))
    pipes.prepare()
    return pipes


def test_no_such_group_means_the_owner_alone(caplog: pytest.LogCaptureFixture) -> None:
    access = resolve_access(-1, "gpushare-test-no-such-group")
    assert access == PipeAccess(os.geteuid(), None) and access.mode == 0o700
    assert "gpushare-test-no-such-group" in caplog.text


def test_a_group_by_name_or_number_gives_0750() -> None:
    import grp

    own = grp.getgrgid(os.getegid()).gr_name
    assert resolve_access(-1, own) == PipeAccess(os.geteuid(), os.getegid())
    assert resolve_access(os.getegid(), "ignored-when-a-gid-is-set").gid == os.getegid()
    assert resolve_access(-1, "").gid is None


@pytest.mark.parametrize(("gid", "wanted"), [(None, 0o700), (os.getegid(), 0o750)])
def test_prepare_gives_the_directories_their_owner_group_and_mode(
    tmp_path: Path, gid: int | None, wanted: int
) -> None:
    pipes = watch(tmp_path, gid)
    for directory in (pipes.paths.pipe_dir, pipes.paths.log_dir):
        info = os.stat(directory)
        assert stat.S_IMODE(info.st_mode) == wanted and info.st_uid == os.geteuid()
        if gid is not None:
            assert info.st_gid == gid
    assert mode(pipes.paths.base) == 0o755  # clients traverse it, nobody else writes it


def test_world_writable_files_in_a_closed_directory_are_accepted(tmp_path: Path) -> None:
    pipes = watch(tmp_path, None)
    control = Path(pipes.paths.pipe_dir) / "control"
    control.write_text("")
    control.chmod(0o666)  # what nvidia-cuda-mps-control itself does
    pipes.check_start()
    assert pipes.check() == [] and pipes.violations_total == 0


def test_world_writable_files_others_can_reach_refuse_the_start(tmp_path: Path) -> None:
    pipes = watch(tmp_path, None)
    control = Path(pipes.paths.pipe_dir) / "control"
    control.write_text("")
    control.chmod(0o666)
    os.chmod(pipes.paths.pipe_dir, 0o755)
    with pytest.raises(PipePermissionError, match="world-writable"):
        pipes.check_start()


@pytest.mark.parametrize("privileged_mode", [0o770, 0o707, 0o722])
def test_a_privileged_socket_open_to_others_refuses_the_start(
    tmp_path: Path, privileged_mode: int
) -> None:
    pipes = watch(tmp_path, os.getegid())
    privileged = Path(pipes.paths.pipe_dir) / "control_privileged"
    privileged.write_text("")
    privileged.chmod(privileged_mode)
    with pytest.raises(PipePermissionError, match="control_privileged"):
        pipes.check_start()


def test_a_probe_counts_and_undoes_a_widened_pipe_directory(tmp_path: Path) -> None:
    pipes = watch(tmp_path, os.getegid())
    pipes.check_start()
    os.chmod(pipes.paths.pipe_dir, 0o777)
    problems = pipes.check()
    assert len(problems) == 1 and "0777" in problems[0] and "restored" in problems[0]
    assert mode(pipes.paths.pipe_dir) == 0o750
    assert pipes.violations_total == 1
    assert pipes.check() == [] and pipes.violations_total == 1  # counted once


def test_a_probe_counts_a_changed_file_and_closes_the_privileged_socket(tmp_path: Path) -> None:
    pipes = watch(tmp_path, None)
    control = Path(pipes.paths.pipe_dir) / "control"
    privileged = Path(pipes.paths.pipe_dir) / "control_privileged"
    for path, file_mode in ((control, 0o666), (privileged, 0o700)):
        path.write_text("")
        path.chmod(file_mode)
    pipes.check_start()
    control.chmod(0o600)
    privileged.chmod(0o777)
    problems = pipes.check()
    assert any("control changed from 0666" in p for p in problems)
    assert any("control_privileged" in p and "closed" in p for p in problems)
    assert mode(privileged) == 0o700
    assert pipes.violations_total == len(problems) >= 3
    assert pipes.check() == []  # the new modes are now what was seen


def test_a_widened_parent_is_found(tmp_path: Path) -> None:
    pipes = watch(tmp_path, None)
    pipes.check_start()
    os.chmod(pipes.paths.base, 0o777)
    assert any("writable by group or others" in p for p in pipes.check())
    assert mode(pipes.paths.base) == 0o755
