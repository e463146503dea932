"""The agent as the kubelet's device plugin: Allocate hands out the oldest pod lease
waiting for it, and PreStartContainer refuses a container of another pod than the lease's
(the kubelet's PodResources says which pod got the share units). Allocate for ids never
advertised is refused and leaves the waiting lease alone; a bind retried after the hold
starts it again; what was handed out before a restart stays handed out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from agent.config import Settings
from agent.core.types import AdmissionRequest, PriorityClass
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import App, Ports
from tests.helpers import FakeClock, running_app, short_dir, sim_settings
from tests.kubeworld.kubelet.device_plugin import FakeKubelet, eventually

SLOTS = 8
HOLD_S = 30.0


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture
async def kubelet(root: Path) -> AsyncIterator[FakeKubelet]:
    fake = FakeKubelet(root / "kubelet")
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def agent_settings(root: Path, kubelet: FakeKubelet) -> Settings:
    return sim_settings(
        root,
        **{
            "estimator.model_dir": "none",
            "kubelet.enabled": True,
            "kubelet.plugin_dir": str(kubelet.plugin_dir),
            "kubelet.pod_resources_socket": str(kubelet.pod_resources_socket),
            "kubelet.slots": SLOTS,
            "kubelet.hold_s": HOLD_S,
            "kubelet.shm_dir": str(root / "shm"),
        },
    )


def agent_ports() -> Ports:
    return Ports(
        gpu=FakeGpuBackend.with_gpus(2),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )


async def serving(kubelet: FakeKubelet, registrations: int = 1) -> None:
    """Until the agent's plugin has registered ``registrations`` times in all and listed
    its units (a restarted agent registers again)."""
    await kubelet.wait_for(
        lambda: len(kubelet.register_requests) >= registrations and len(kubelet.healthy()) == SLOTS
    )


@pytest.fixture
async def agent(root: Path, kubelet: FakeKubelet) -> AsyncIterator[App]:
    async with running_app(agent_settings(root, kubelet), agent_ports()) as app:
        await serving(kubelet)
        yield app


async def admit(app: App, pod: str, memory_gib: int = 4) -> str:
    assert app.node is not None
    request = AdmissionRequest(
        f"uid-{pod}", "ns", "ns", PriorityClass.BURSTABLE, memory_gib * GIB, 25, pod=f"ns/{pod}"
    )
    result = await app.node.admit(request)
    assert result.lease is not None
    return result.lease.lease_id


async def test_each_pod_gets_its_own_lease_in_bind_order(agent: App, kubelet: FakeKubelet) -> None:
    first, second = await admit(agent, "a"), await admit(agent, "b", 8)
    got_a = await kubelet.allocate("ns", "a", "main", 1)
    got_b = await kubelet.allocate("ns", "b", "main", 1)
    assert got_a.error is None and got_b.error is None
    assert got_a.response is not None and got_b.response is not None
    env_a, env_b = dict(got_a.response.envs), dict(got_b.response.envs)
    assert (env_a["GPUSHARE_LEASE_ID"], env_b["GPUSHARE_LEASE_ID"]) == (first, second)
    assert env_a["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env_b["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert env_a["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env_a["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
    mounts = {m.container_path: m.host_path for m in got_a.response.mounts}
    assert mounts[env_a["CUDA_MPS_PIPE_DIRECTORY"]] == env_a["CUDA_MPS_PIPE_DIRECTORY"]
    assert mounts["/dev/shm"].endswith("/shm")
    assert await agent.events.flush()

    def allocated() -> list[str | None]:
        return [e.lease_id for e in agent.events.since(0) if e.kind == "lease.allocated"]

    await eventually(lambda: len(allocated()) >= 2)
    assert allocated() == [first, second]


async def test_a_lease_whose_units_went_to_another_pod_is_not_handed_out_again(
    agent: App, kubelet: FakeKubelet
) -> None:
    """The kubelet gives an ended pod's share units to the next pod before the old lease is
    released: that lease was handed out all the same, and the pod after gets its own."""
    first = await admit(agent, "a")
    assert (await kubelet.allocate("ns", "a", "main", 1)).error is None
    kubelet.release("ns", "a")  # pod a ended; its lease lives until the controller's Release
    second = await admit(agent, "b")
    got_b = await kubelet.allocate("ns", "b", "main", 1)  # takes a's freed unit
    third = await admit(agent, "c")
    got_c = await kubelet.allocate("ns", "c", "main", 1)
    assert got_b.error is None and got_c.error is None, (got_b.error, got_c.error)
    assert got_b.response is not None and got_c.response is not None
    assert got_b.response.envs["GPUSHARE_LEASE_ID"] == second
    assert got_c.response.envs["GPUSHARE_LEASE_ID"] == third != first


async def test_a_container_of_another_pod_is_refused_at_pre_start(
    agent: App, kubelet: FakeKubelet
) -> None:
    lease = await admit(agent, "a")
    await admit(agent, "b")
    wrong = await kubelet.allocate("ns", "b", "main", 1)  # the kubelet took b first
    assert wrong.failed_at == "PreStartContainer" and wrong.error is not None
    assert wrong.error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"lease {lease} of pod ns/a" in str(wrong.error.details())
    assert "gave them to pod ns/b" in str(wrong.error.details())
    assert await agent.events.flush()
    await eventually(  # published once durable
        lambda: any(
            e.kind == "lease.allocation_mismatch"
            for e in agent.events.since(0)
            if e.lease_id == lease
        )
    )


async def test_allocate_with_no_pod_lease_waiting_is_refused(
    agent: App, kubelet: FakeKubelet
) -> None:
    refused = await kubelet.allocate("ns", "stray", "main", 1)
    assert refused.failed_at == "Allocate" and refused.error is not None
    assert refused.error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "must be bound by the gpushare scheduler" in str(refused.error.details())


async def test_the_device_plugin_leaves_with_the_agent(root: Path, kubelet: FakeKubelet) -> None:
    settings = sim_settings(
        root,
        **{
            "estimator.model_dir": "none",
            "kubelet.enabled": True,
            "kubelet.plugin_dir": str(kubelet.plugin_dir),
            "kubelet.pod_resources_socket": str(kubelet.pod_resources_socket),
        },
    )
    ports = Ports(
        gpu=FakeGpuBackend.with_gpus(1),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )
    async with running_app(settings, ports):
        await kubelet.wait_for(lambda: len(kubelet.healthy()) == 64)
    await eventually(lambda: not kubelet.healthy())  # streams ended: devices unhealthy
    assert not (kubelet.plugin_dir / "gpushare.sock").exists()


@pytest.mark.parametrize(
    "ids", [["share-8"], ["share-0", "share-999"], ["GPU-0"]], ids=["past", "mixed", "foreign"]
)
async def test_allocate_for_units_never_advertised_is_refused_and_leaves_the_lease_waiting(
    agent: App, kubelet: FakeKubelet, ids: list[str]
) -> None:
    lease = await admit(agent, "a")
    stray = await kubelet.allocate_ids("ns", "stray", "main", ids)
    assert stray.failed_at == "Allocate" and isinstance(stray.error, grpc.aio.AioRpcError)
    assert stray.error.code() is grpc.StatusCode.FAILED_PRECONDITION
    details = str(stray.error.details())
    assert "no lease is handed out" in details
    assert all(i in details for i in ids if i != "share-0"), details
    own = await kubelet.allocate("ns", "a", "main", 1)  # the pod the lease waits for
    assert own.error is None, own.error
    assert own.response is not None and own.response.envs["GPUSHARE_LEASE_ID"] == lease


async def test_a_bind_retried_after_the_hold_gets_its_lease_allocated(
    root: Path, kubelet: FakeKubelet
) -> None:
    clock = FakeClock()
    async with running_app(agent_settings(root, kubelet), agent_ports(), clock=clock) as app:
        await serving(kubelet)
        lease = await admit(app, "a")  # the binder's Admit; its Binding is slow to land
        clock.advance(HOLD_S + 1)
        late = await kubelet.allocate("ns", "a", "main", 1)
        assert late.failed_at == "Allocate", "the hold has passed"
        assert await admit(app, "a") == lease  # the bind retried: same request id
        got = await kubelet.allocate("ns", "a", "main", 1)
    assert got.error is None, got.error
    assert got.response is not None and got.response.envs["GPUSHARE_LEASE_ID"] == lease


async def test_a_hold_started_again_is_still_running_after_a_restart(
    root: Path, kubelet: FakeKubelet
) -> None:
    clock = FakeClock()
    settings = agent_settings(root, kubelet)
    async with running_app(settings, agent_ports(), clock=clock) as app:
        await serving(kubelet)
        lease = await admit(app, "a")
        clock.advance(HOLD_S + 1)
        assert await admit(app, "a") == lease  # the hold starts again, on disk
    clock.advance(HOLD_S / 2)
    async with running_app(settings, agent_ports(), clock=clock) as app:
        await serving(kubelet, registrations=2)
        got = await kubelet.allocate("ns", "a", "main", 1)
    assert got.error is None, got.error
    assert got.response is not None and got.response.envs["GPUSHARE_LEASE_ID"] == lease


async def test_what_was_handed_out_before_a_restart_stays_handed_out(
    root: Path, kubelet: FakeKubelet
) -> None:
    """The agent stops between a's Allocate and its PreStartContainer: after the restart
    a's container starts under a's lease, and b's Allocate gets b's, not a's (whose hold
    still runs)."""
    settings = agent_settings(root, kubelet)
    async with running_app(settings, agent_ports()) as app:
        await serving(kubelet)
        lease_a = await admit(app, "a")
        allocated = await kubelet.allocate("ns", "a", "main", 1, pre_start=False)
        assert allocated.error is None
    async with running_app(settings, agent_ports()) as app:
        await serving(kubelet, registrations=2)
        started = await kubelet.pre_start("ns", "a", "main")
        assert started.error is None, started.error
        lease_b = await admit(app, "b")
        got_b = await kubelet.allocate("ns", "b", "main", 1)
        assert got_b.error is None, (got_b.failed_at, got_b.error)
        assert got_b.response is not None
        assert got_b.response.envs["GPUSHARE_LEASE_ID"] == lease_b != lease_a
