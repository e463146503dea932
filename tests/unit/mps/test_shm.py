"""The pure parts of per-device shared memory: whether a starter isolates its daemons (the
non-root fallback), what an adopted daemon's servers see, mountinfo reading, the record,
emptying a directory, the settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.config.mps import MpsSettings
from agent.core.errors import ConfigError
from agent.mps import shm, shmexec, shmstate
from agent.mps.shm import Isolation
from agent.mps.shmstate import DaemonRecord, ShmOptions, ShmState

ON = ShmOptions("/run/gpushare/shm", 1 << 30)
UUID = "GPU-1"
OWN = "/run/gpushare/shm/GPU-1"
EPERM = "Operation not permitted"


@pytest.mark.parametrize(
    ("options", "euid", "probe", "want"),
    [
        (ShmOptions(), 0, "", shm.OFF),
        (ON, 0, "", Isolation(True)),
        (
            ON,
            1000,
            "",
            Isolation(False, "not root (uid 1000): cannot mount a tmpfs or make a mount namespace"),
        ),
        (
            ON,
            0,
            "unshare(CLONE_NEWNS): Operation not permitted",
            Isolation(
                False,
                "cannot make a mount namespace: unshare(CLONE_NEWNS): Operation not permitted",
            ),
        ),
    ],
    ids=["off", "root", "not-root", "no-namespace"],
)
def test_a_starter_isolates_its_daemons_only_where_it_can(
    options: ShmOptions, euid: int, probe: str, want: Isolation
) -> None:
    assert shm.decide(options, euid=euid, probe_error=probe) == want


def record(pid: int = 42, start: int | None = 7, directory: str = OWN) -> DaemonRecord:
    return DaemonRecord(pid, start, directory, "" if directory else "not root")


@pytest.mark.parametrize(
    ("rec", "seen", "kind", "directory"),
    [
        (record(), True, "own", OWN),
        (record(), None, "own", OWN),  # cannot look: the record is believed
        (None, True, "own", OWN),  # seen is proof enough
        (record(), False, "mismatch", ""),  # recorded, but not what it has
        (record(directory="/elsewhere/GPU-1"), None, "mismatch", ""),
        (record(directory=""), None, "shared", ""),
        (record(pid=41), None, "legacy", ""),  # a predecessor's record
        (record(start=8), None, "legacy", ""),  # the PID reused since
        (None, None, "legacy", ""),
        (None, False, "legacy", ""),
    ],
)
def test_what_an_adopted_daemon_gives_its_servers(
    rec: DaemonRecord | None, seen: bool | None, kind: str, directory: str
) -> None:
    state = shmstate.judge(ON, UUID, pid=42, start=7, record=rec, seen=seen)
    assert (state.kind, state.directory) == (kind, directory)
    assert state.reason or kind == "own"


def test_with_no_root_configured_nothing_is_judged() -> None:
    state = shmstate.judge(ShmOptions(), UUID, pid=1, start=1, record=record(), seen=True)
    assert state == ShmState("off", reason="mps.shm_root is empty")


MOUNTINFO = "\n".join(
    [
        "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw",
        "30 22 0:40 / /dev/shm rw,nosuid,nodev shared:2 - tmpfs shm rw,size=65536k",
        r"41 22 0:41 / /run/gs\040x/shm/GPU-1 rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs "
        "rw,size=1048576k,mode=1777",
        r"42 22 0:42 / /run/gs\040x/shm/GPU-2 rw,relatime - tmpfs tmpfs rw",
        r"43 22 0:43 / /run/gs\040x/shmother rw - tmpfs tmpfs rw",
        "44 30 0:41 / /dev/shm rw,nosuid,nodev,noexec - tmpfs tmpfs rw,size=8192k",
    ]
)


def test_mountinfo_is_read_with_its_escapes_options_and_sizes() -> None:
    own = shm.mount_of("/run/gs x/shm/GPU-1", MOUNTINFO)
    assert own is not None and own.fstype == "tmpfs" and own.bounded
    assert own.size_bytes == 1 << 30 and own.lacks() == []
    other = shm.mount_of("/run/gs x/shm/GPU-2/", MOUNTINFO)
    assert other is not None and other.size_bytes is None and not other.bounded
    assert other.lacks() == ["nosuid", "nodev", "noexec"]
    top = shm.mount_of("/dev/shm", MOUNTINFO)  # the later mount is on top
    assert top is not None and top.size_bytes == 8 << 20
    assert shm.mount_of("/nowhere", MOUNTINFO) is None
    assert shmexec.mounts_under("/run/gs x/shm", MOUNTINFO) == [
        "/run/gs x/shm/GPU-1",
        "/run/gs x/shm/GPU-2",
    ]


def test_the_record_names_its_process(tmp_path: Path) -> None:
    path = str(tmp_path / "shm.json")
    shmexec.write_record(path, directory=OWN, reason="")
    read = shmstate.read_record(path)
    assert read == DaemonRecord(os.getpid(), shmexec.start_time(), OWN, "")
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    (tmp_path / "bad.json").write_text("{not json")
    assert shmstate.read_record(str(tmp_path / "bad.json")) is None
    assert shmstate.read_record(str(tmp_path / "missing.json")) is None


def test_emptying_removes_everything_and_follows_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    directory = tmp_path / "GPU-1"
    directory.mkdir()
    (directory / "mps.shm.1000.4428").write_bytes(b"x")
    (directory / "torch_1" / "deep").mkdir(parents=True)
    (directory / "link").symlink_to(outside, target_is_directory=True)
    assert shmstate.empty(str(directory)) == 3
    assert os.listdir(directory) == [] and (outside / "keep").exists()


def test_the_trust_domain_is_recorded_outside_the_directory(tmp_path: Path) -> None:
    options = ShmOptions(str(tmp_path), 1 << 20)
    assert shmstate.domain_of(options, UUID) is None
    shmstate.set_domain(options, UUID, "team-a")
    assert shmstate.domain_of(options, UUID) == "team-a"
    assert options.domain_file(UUID) == f"{tmp_path}/.domains/{UUID}"
    assert not options.domain_file(UUID).startswith(options.device_dir(UUID) + "/")


def test_without_a_root_a_daemon_is_started_as_before(tmp_path: Path) -> None:
    assert shm.launch_prefix(ShmOptions(), shm.OFF, UUID, "r.json") == ([], shm.OFF)


def test_a_directory_that_cannot_be_mounted_falls_back_to_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(_options: ShmOptions, _uuid: str) -> str:
        raise PermissionError(1, "mount tmpfs on /x: Operation not permitted")

    monkeypatch.setattr(shm, "prepare_dir", refuse)
    prefix, given = shm.launch_prefix(ON, Isolation(True), UUID, "r.json")
    assert not given.isolated and "Operation not permitted" in given.reason
    assert prefix[3:] == ["--record", "r.json", "--shared", given.reason, "--"]


def test_an_isolated_daemon_is_started_through_the_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm, "prepare_dir", lambda options, uuid: options.device_dir(uuid))
    prefix, given = shm.launch_prefix(ON, Isolation(True), UUID, "r.json")
    assert given.isolated
    assert prefix[1:3] == ["-m", "agent.mps.shmexec"]
    assert prefix[3:] == ["--record", "r.json", "--shm", OWN, "--root", ON.root, "--"]


@pytest.mark.parametrize(
    ("size", "want"),
    [("1GiB", 1 << 30), ("1Gi", 1 << 30), ("512Mi", 512 << 20), ("64M", 64 << 20)],
)
def test_the_size_is_read_as_people_and_kubernetes_write_it(size: str, want: int) -> None:
    assert MpsSettings(shm_size=size).shm_size_bytes == want
    assert ShmOptions.of(MpsSettings(shm_root="/run/x/", shm_size=size)) == ShmOptions(
        "/run/x", want
    )


@pytest.mark.parametrize(
    ("values", "key", "said"),
    [
        ({"shm_size": "lots"}, "mps.shm_size", "cannot read"),
        ({"shm_size": "512k"}, "mps.shm_size", "at least 1MiB"),
        ({"shm_root": "run/shm"}, "mps.shm_root", "absolute"),
        ({"shm_root": "/dev/shm"}, "mps.shm_root", "cannot be"),
        ({"shm_root": "/"}, "mps.shm_root", "cannot be"),
    ],
)
def test_bad_settings_are_refused_at_load(values: dict[str, str], key: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as caught:
        MpsSettings(**values)
    assert caught.value.key == key
