"""Each MPS device's shared memory is its own (mps.shm_root): a tmpfs of mps.shm_size,
nosuid, nodev, noexec, that its daemon and servers see at /dev/shm in a mount namespace of
their own and nobody else's daemon sees; a trust domain change shuts the servers down,
empties it and sets the defaults again; a daemon of an earlier release keeps the shared
/dev/shm until its device has no lease, then is started again with its own.

Real mounts and namespaces (root), the real nvidia-cuda-mps-control where it is installed
and the fake one (whose stand-in servers make their region in the /dev/shm they see)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path

import pytest

from agent.core.errors import MpsError
from agent.core.types import Device
from agent.core.units import GIB, MIB
from agent.gpu.fake import FakeGpuBackend
from agent.mps import shm, shmexec, shmstate
from agent.mps.control import SubprocessMpsControl
from agent.mps.daemon import lock_holder
from agent.mps.host import MpsHost
from agent.mps.manager import SupervisedMpsManager
from agent.mps.options import DaemonDefaults, SupervisorOptions
from agent.mps.port import ControlChannel
from tests.helpers import short_dir
from tests.integration.mps import harness
from tests.integration.mps.harness import (
    BINARIES,
    FAKE_BINARY,
    Recorder,
    supervisor_options,
    wait_for,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts and namespaces need root")

A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
SIZE = 8 * MIB


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        try:
            yield path
        finally:
            for point in shmexec.mounts_under(str(path), shm.read_mountinfo()):
                with contextlib.suppress(OSError):
                    shmexec.detach(point)


def options(binary: str, root: Path, **more: object) -> SupervisorOptions:
    shm_options = shmstate.ShmOptions(str(root / "shm"), SIZE)
    return supervisor_options(binary, root, **{"hung_after_probes": 2, "shm": shm_options, **more})


def manager_of(opts: SupervisorOptions) -> tuple[SupervisedMpsManager, Recorder]:
    gpu = FakeGpuBackend.with_gpus(2)
    recorder = Recorder()

    def channel(_device: Device, env: Mapping[str, str]) -> ControlChannel:
        return SubprocessMpsControl(opts.binary, env, timeout_s=2.0)

    async def set_exclusive(d: Device, exclusive: bool) -> None:
        await gpu.set_compute_mode(d, exclusive=exclusive)

    manager = SupervisedMpsManager(
        opts,
        lambda _d: DaemonDefaults(thread_pct=40.0, memory_limit_bytes=20 * GIB),
        channel_factory=channel,
        emit=recorder,
        set_exclusive=set_exclusive,
    )
    return manager, recorder


DEVICES = [Device(A, 0, "H100", 80 * GIB), Device(B, 1, "H100", 80 * GIB)]


@contextlib.asynccontextmanager
async def started(
    manager: SupervisedMpsManager, devices: list[Device], *, run: bool = False
) -> AsyncIterator[SupervisedMpsManager]:
    await manager.start(devices)
    task = asyncio.create_task(manager.run()) if run else None
    try:
        yield manager
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await manager.aclose()


def front_end(binary: str, manager: SupervisedMpsManager, uuid: str, command: str) -> str:
    return harness.front_end(binary, manager.supervisor(uuid), command).strip()


def pid_of(manager: SupervisedMpsManager, uuid: str) -> int:
    pid = manager.supervisor(uuid).state().pid
    assert pid
    return pid


# -- each daemon's own /dev/shm --------------------------------------------------------------


@pytest.mark.parametrize("binary", BINARIES)
async def test_each_daemon_sees_its_own_bounded_tmpfs_at_dev_shm(root: Path, binary: str) -> None:
    manager, events = manager_of(options(binary, root))
    async with started(manager, DEVICES):
        dirs = {}
        for device in DEVICES:
            uuid, pid = device.uuid, pid_of(manager, device.uuid)
            here = str(root / "shm" / uuid)
            dirs[uuid] = here
            assert manager.shm_dir(uuid) == here
            assert shmstate.sees(pid, here) is True, "its /dev/shm is its device's directory"
            theirs = shm.mount_of("/dev/shm", shm.read_mountinfo(pid))
            assert theirs is not None and theirs.fstype == "tmpfs"
            assert theirs.size_bytes == SIZE and not theirs.lacks(), theirs
            # the host's view: the tmpfs the runtime binds into the clients' containers
            ours = shm.mount_of(here, shm.read_mountinfo())
            assert ours is not None and ours.size_bytes == SIZE and not ours.lacks(), ours
            assert stat.S_IMODE(os.stat(here).st_mode) == 0o1777
            # nothing else of the root in its namespace: not the other device's memory
            assert shmexec.mounts_under(str(root / "shm"), shm.read_mountinfo(pid)) == []
            assert shmstate.sees(pid, "/dev/shm") is False  # not the starter's
        assert dirs[A] != dirs[B] and not shmstate.sees(pid_of(manager, A), dirs[B])
        assert stat.S_IMODE(os.stat(root / "shm").st_mode) == 0o700
        assert events.kinds().count("mps.shm_own") == 2
    for directory in dirs.values():  # quit by the agent: the tmpfs goes with the daemon
        assert shm.mount_of(directory, shm.read_mountinfo()) is None


async def test_a_server_makes_its_region_in_its_devices_directory(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's children (its servers) share its namespace: the fake's stand-in server
    creates mps.shm.<uid>.<pid> in the /dev/shm it sees, which is the device's directory."""
    monkeypatch.setenv("GPUSHARE_FAKE_MPS_SHM", "1")
    manager, _events = manager_of(options(FAKE_BINARY, root))
    async with started(manager, DEVICES):
        front_end(FAKE_BINARY, manager, A, f"fake_connect_client {os.getpid()} 1000")
        [server] = await manager.supervisor(A).client.server_pids()
        region = root / "shm" / A / f"mps.shm.0.{server}"
        await wait_for(region.exists, 5.0)
        assert os.listdir(root / "shm" / B) == []
        assert not Path(f"/dev/shm/mps.shm.0.{server}").exists()


# -- trust domains ---------------------------------------------------------------------------


@pytest.mark.parametrize("binary", BINARIES)
async def test_a_trust_domain_change_empties_the_directory_and_sets_the_defaults_again(
    root: Path, binary: str
) -> None:
    # no health loop and a long probe: what is set again is set by the claim itself
    manager, events = manager_of(options(binary, root, probe_interval_s=60.0))
    async with started(manager, DEVICES):
        here = root / "shm" / A
        assert await manager.claim_shm(A, "team-a") == str(here)
        assert shmstate.domain_of(manager.supervisor(A).options.shm, A) == "team-a"
        (here / "mps.shm.1000.4428").write_bytes(b"team-a's data")
        (here / "torch_123").mkdir()
        assert await manager.claim_shm(A, "team-a") == str(here)  # same domain: kept
        assert sorted(os.listdir(here)) == ["mps.shm.1000.4428", "torch_123"]

        front_end(binary, manager, A, "set_default_active_thread_percentage 100")
        front_end(binary, manager, A, "set_default_device_pinned_mem_limit 0 0")
        assert await manager.claim_shm(A, "team-b") == str(here)
        assert os.listdir(here) == []
        assert shmstate.domain_of(manager.supervisor(A).options.shm, A) == "team-b"
        assert front_end(binary, manager, A, "get_default_active_thread_percentage") == "40.0"
        assert front_end(binary, manager, A, "get_default_device_pinned_mem_limit 0") == "20G"
        assert "mps.shm_domain_changed" in events.kinds()
        assert shmstate.sees(pid_of(manager, A), str(here)) is True  # the same daemon
        assert await manager.claim_shm(B, "team-a") == str(root / "shm" / B)  # per device


async def test_a_domain_change_whose_defaults_fail_is_done_again_by_the_next_claim(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new domain is recorded last: a change whose defaults step failed leaves the old
    domain, so the next claim of the new one does the change again instead of handing the
    directory out with defaults a tenant may have changed."""
    manager, _events = manager_of(options(FAKE_BINARY, root, probe_interval_s=60.0))
    async with started(manager, DEVICES):
        supervisor = manager.supervisor(A)
        assert await manager.claim_shm(A, "team-a")
        apply_defaults = supervisor.apply_defaults
        applied: list[str] = []

        async def failing() -> None:
            applied.append("failed")
            raise MpsError("the defaults could not be set")

        monkeypatch.setattr(supervisor, "apply_defaults", failing)
        with pytest.raises(MpsError):
            await manager.claim_shm(A, "team-b")
        assert shmstate.domain_of(supervisor.options.shm, A) == "team-a"

        async def counted() -> None:
            applied.append("set")
            await apply_defaults()

        monkeypatch.setattr(supervisor, "apply_defaults", counted)
        assert await manager.claim_shm(A, "team-b")
        assert applied == ["failed", "set"]
        assert shmstate.domain_of(supervisor.options.shm, A) == "team-b"


async def test_a_domain_change_whose_caller_is_cancelled_runs_to_its_end(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kubelet deadline cancels the claim during the change: the change still ends whole
    (emptied, defaults set, domain recorded) before another claim sees the directory."""
    manager, _events = manager_of(options(FAKE_BINARY, root, probe_interval_s=60.0))
    async with started(manager, DEVICES):
        supervisor = manager.supervisor(A)
        here = root / "shm" / A
        assert await manager.claim_shm(A, "team-a")
        (here / "team-a-file").write_bytes(b"x")
        apply_defaults = supervisor.apply_defaults
        entered = asyncio.Event()

        async def slow() -> None:
            entered.set()
            await asyncio.sleep(0.3)
            await apply_defaults()

        monkeypatch.setattr(supervisor, "apply_defaults", slow)
        claim = asyncio.ensure_future(manager.claim_shm(A, "team-b"))
        await entered.wait()
        claim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claim
        assert shmstate.domain_of(supervisor.options.shm, A) == "team-b"
        assert os.listdir(here) == []


async def test_a_trust_domain_change_shuts_the_servers_down_first(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSHARE_FAKE_MPS_SHM", "1")
    manager, events = manager_of(options(FAKE_BINARY, root, probe_interval_s=60.0))
    async with started(manager, DEVICES):
        await manager.claim_shm(A, "team-a")
        front_end(FAKE_BINARY, manager, A, f"fake_connect_client {os.getpid()} 1000")
        client = manager.supervisor(A).client
        [server] = await client.server_pids()
        await wait_for((root / "shm" / A / f"mps.shm.0.{server}").exists, 5.0)
        await manager.claim_shm(A, "team-b")
        assert await client.server_pids() == []
        assert os.listdir(root / "shm" / A) == []
        changes = [m for k, m, _a in events.events if k == "mps.shm_domain_changed"]
        assert "(before: none); 0 server(s)" in changes[0]  # the first use
        assert "(before: team-a); 1 server(s) shut down" in changes[1]


async def test_nothing_is_handed_out_while_the_daemon_is_down(root: Path) -> None:
    from agent.core.errors import MpsError

    manager, _events = manager_of(options(FAKE_BINARY, root, probe_interval_s=60.0))
    async with started(manager, DEVICES[:1]):
        manager.supervisor(A)._up_since = None  # down, as the health loop would mark it
        with pytest.raises(MpsError, match="no running MPS daemon"):
            await manager.claim_shm(A, "team-a")


# -- daemons of an earlier release, and of the MPS host ---------------------------------------


@pytest.mark.parametrize("binary", BINARIES)
async def test_a_legacy_daemon_keeps_the_shared_dev_shm_until_its_device_has_no_lease(
    root: Path, binary: str
) -> None:
    """Started without the record (as the previous release did): adopted, not disturbed,
    its clients keep getting the caller's shared directory (shm_dir ""); once the device's
    only lease is the one being handed out, it is quit and started again with its own."""
    opts = options(binary, root)
    manager, events = manager_of(opts)
    pipe, logs = root / "mps" / A / "pipe", root / "mps" / A / "log"
    pipe.mkdir(parents=True)
    logs.mkdir(parents=True)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    subprocess.run([binary, "-d"], env=env, check=True, timeout=10)
    await wait_for(lambda: bool(lock_holder(str(pipe))), 5.0)
    legacy = lock_holder(str(pipe))
    async with started(manager, DEVICES[:1], run=True):
        assert pid_of(manager, A) == legacy and "mps.daemon_adopted" in events.kinds()
        assert manager.supervisor(A).memory.state.kind == "legacy"
        assert manager.shm_dir(A) == ""
        assert await manager.claim_shm(A, "team-a", sole=False) == ""  # other leases: kept
        assert pid_of(manager, A) == legacy

        here = str(root / "shm" / A)
        assert await manager.claim_shm(A, "team-a", sole=True) == here
        renewed = pid_of(manager, A)
        assert renewed != legacy and shmstate.sees(renewed, here) is True
        assert manager.shm_dir(A) == here
        # Through the supervisor's client, whose lock the running probe shares: the daemon
        # serves one UI at a time, and a front end of its own could meet a probe there.
        assert await manager.supervisor(A).client.default_thread_pct() == 40.0
        assert "mps.shm_shared" in events.kinds() and "mps.shm_own" in events.kinds()
        down = [m for k, m, _a in events.events if k == "mps.daemon_down"]
        assert down and down[-1].endswith("quit to get shared memory of its own")


async def test_the_agent_adopts_the_hosts_daemon_with_its_own_shared_memory(root: Path) -> None:
    opts = options(FAKE_BINARY, root)
    host = MpsHost(DEVICES[:1], opts, 2.0)
    keeping = asyncio.create_task(host.run())
    try:
        pipe = str(root / "mps" / A / "pipe")
        await wait_for(lambda: bool(lock_holder(pipe)), 10.0)
        daemon = lock_holder(pipe)
        assert daemon and shmstate.sees(daemon, str(root / "shm" / A)) is True
        agent, _events = manager_of(options(FAKE_BINARY, root, by_host=True))
        async with started(agent, DEVICES[:1]):
            assert pid_of(agent, A) == daemon
            assert agent.shm_dir(A) == str(root / "shm" / A)
            assert await agent.claim_shm(A, "team-a") == str(root / "shm" / A)
        assert lock_holder(pipe) == daemon, "the agent leaves the host's daemon running"
    finally:
        keeping.cancel()
        await asyncio.gather(keeping, return_exceptions=True)
        await host.stop()
    assert shm.mount_of(str(root / "shm" / A), shm.read_mountinfo()) is None


async def test_a_daemon_started_shared_is_reported_with_why(root: Path) -> None:
    """The fallback (not root, no namespace) as its record says: clients get the caller's
    shared directory, and the reason reaches the events."""
    manager, events = manager_of(options(FAKE_BINARY, root))
    reason = "not root (uid 1000): cannot mount a tmpfs or make a mount namespace"

    async def not_root(_options: shmstate.ShmOptions) -> shm.Isolation:
        return shm.Isolation(False, reason)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shm, "isolation_here", not_root)
        async with started(manager, DEVICES[:1]):
            assert manager.supervisor(A).memory.state == shmstate.ShmState("shared", reason=reason)
            assert manager.shm_dir(A) == ""
            assert await manager.claim_shm(A, "team-a", sole=True) == ""
            record = shmstate.read_record(f"{root}/mps/{A}/shm.json")
            assert record is not None and record.pid == pid_of(manager, A)
            assert record.directory == "" and record.reason == reason
            assert shmstate.sees(pid_of(manager, A), "/dev/shm") is True
    assert [m for k, m, _a in events.events if k == "mps.shm_shared"] == [reason]


# -- what the doctor finds -------------------------------------------------------------------


async def test_the_doctor_finds_each_daemons_tmpfs_and_a_legacy_one(root: Path) -> None:
    from agent.config.loading import load_settings
    from agent.doctor import check_shm
    from agent.doctor.gather import shm_facts

    settings = load_settings(
        overrides={
            "mps.root_dir": str(root / "mps"),
            "mps.shm_root": str(root / "shm"),
            "mps.shm_size": "8MiB",
            "kubelet.enabled": True,
            "kubelet.shm_dir": str(root / "shared"),
        }
    )
    (root / "shared").mkdir(mode=0o1777)
    os.chmod(root / "shared", 0o1777)
    pipe, logs = root / "mps" / B / "pipe", root / "mps" / B / "log"
    pipe.mkdir(parents=True)
    logs.mkdir(parents=True)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    subprocess.run([FAKE_BINARY, "-d"], env=env, check=True, timeout=10)  # an earlier release's
    manager, _events = manager_of(options(FAKE_BINARY, root))
    async with started(manager, DEVICES):
        facts = shm_facts(settings)
        states = {d.uuid: d for d in facts.devices}
        assert states[A].state == "own" and states[A].fstype == "tmpfs"
        assert states[A].size_bytes == SIZE and states[A].lacks == ()
        assert states[B].state == "legacy" and states[B].fstype == ""  # none made for it yet
        finding = check_shm(facts)
        assert finding.status == "warn" and f"{B}: daemon" in finding.found
        assert f"share {root}/shared" in finding.found
