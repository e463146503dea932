from pathlib import Path

from agent.mps.logfollow import LogFollower


def test_follows_appends_truncation_and_replacement(tmp_path: Path) -> None:
    path = tmp_path / "control.log"
    follower = LogFollower(str(path))
    assert follower.read_new_lines() == []
    path.write_text("one\ntw")
    assert follower.read_new_lines() == ["one"]
    with path.open("a") as f:
        f.write("o\nthree\n")
    assert follower.read_new_lines() == ["two", "three"]
    path.write_text("new\n")  # truncated and rewritten
    assert follower.read_new_lines() == ["new"]
    rotated = tmp_path / "control.log.new"
    rotated.write_text("replaced file\n")
    rotated.rename(path)  # a new file (new inode) under the same name, as log rotation does
    assert follower.read_new_lines() == ["replaced file"]


def test_from_end_skips_history(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("old\n")
    follower = LogFollower(str(path), from_end=True)
    assert follower.read_new_lines() == []
    with path.open("a") as f:
        f.write("fresh\n")
    assert follower.read_new_lines() == ["fresh"]
