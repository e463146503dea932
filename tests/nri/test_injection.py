"""The agent as an NRI plugin, against a runtime stand-in speaking NRI's wire format: it
registers as 10-gpushare for CreateContainer alone; Allocate hands out a marker instead of
pairing a lease, and each container gets its own pod's lease at CreateContainer, in any
order; a pod naming another pod's lease is refused; without the runtime, Allocate pairs
leases again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.legacy.deviceplugin.nri.wire import TtrpcError
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import App, Ports
from tests.helpers import running_app, sim_settings
from tests.integration.api.test_pod_allocation import admit
from tests.kubeworld.kubelet.device_plugin import FakeKubelet, eventually
from tests.nri.runtime import FakeNriRuntime


@pytest.fixture
async def runtime(root: Path) -> AsyncIterator[FakeNriRuntime]:
    fake = FakeNriRuntime(root / "nri" / "nri.sock")
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def agent(root: Path, kubelet: FakeKubelet, runtime: FakeNriRuntime) -> AsyncIterator[App]:
    settings = sim_settings(
        root,
        **{
            "estimator.model_dir": "none",
            "kubelet.enabled": True,
            "kubelet.plugin_dir": str(kubelet.plugin_dir),
            "kubelet.pod_resources_socket": str(kubelet.pod_resources_socket),
            "kubelet.slots": 8,
            "kubelet.nri_socket": str(runtime.socket_path),
        },
    )
    ports = Ports(
        gpu=FakeGpuBackend.with_gpus(2),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )
    async with running_app(settings, ports) as app:
        await kubelet.wait_for(lambda: len(kubelet.healthy()) == 8)
        await eventually(lambda: app.snapshot().injector == "nri")
        yield app


def pod(name: str, lease: str) -> dict[str, object]:
    return {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "annotations": {"gpushare.io/lease": lease},
    }


async def allocated_env(kubelet: FakeKubelet, name: str) -> list[str]:
    got = await kubelet.allocate("ns", name, "main", 1)
    assert got.error is None and got.response is not None
    return [f"{k}={v}" for k, v in got.response.envs.items()]


async def test_the_plugin_registers_for_create_container_alone(
    agent: App, runtime: FakeNriRuntime
) -> None:
    assert runtime.plugins == ["10-gpushare"]
    assert runtime.events_mask == 1 << 3  # CREATE_CONTAINER
    await eventually(lambda: any(e.kind == "kubelet.nri" for e in agent.events.since(0)))


async def test_pods_bound_at_once_each_get_their_own_lease_in_any_order(
    agent: App, kubelet: FakeKubelet, runtime: FakeNriRuntime
) -> None:
    lease_a, lease_b = await admit(agent, "a", 4), await admit(agent, "b", 8)
    env_b = await allocated_env(kubelet, "b")  # the kubelet allocates b first
    env_a = await allocated_env(kubelet, "a")
    assert "GPUSHARE_NRI=1" in env_a and "NVIDIA_VISIBLE_DEVICES=void" in env_a
    assert not any(e.startswith("GPUSHARE_LEASE_ID") for e in env_a), "no lease at Allocate"
    made_a = await runtime.create_container(pod("a", lease_a), "main", env_a)
    made_b = await runtime.create_container(pod("b", lease_b), "main", env_b)
    assert made_a.env["GPUSHARE_LEASE_ID"] == lease_a
    assert made_a.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert made_b.env["GPUSHARE_LEASE_ID"] == lease_b
    assert made_b.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    lease = agent.node.leases[lease_a] if agent.node else None
    assert lease is not None and made_a.env["NVIDIA_VISIBLE_DEVICES"] == lease.device_uuid
    assert {m.destination for m in made_a.mounts} >= {made_a.env["CUDA_MPS_PIPE_DIRECTORY"]}
    assert made_a.annotations == {"gpushare.io/lease": lease_a}

    def allocated() -> list[str | None]:
        return sorted(e.lease_id for e in agent.events.since(0) if e.kind == "lease.allocated")

    await eventually(lambda: allocated() == sorted([lease_a, lease_b]))


async def test_a_pod_naming_another_pods_lease_is_refused(
    agent: App, kubelet: FakeKubelet, runtime: FakeNriRuntime
) -> None:
    lease_a = await admit(agent, "a", 4)
    env = await allocated_env(kubelet, "intruder")
    with pytest.raises(TtrpcError) as refused:
        await runtime.create_container(pod("intruder", lease_a), "main", env)
    assert refused.value.code == 9 and "belongs to pod ns/a" in refused.value.message
    await eventually(
        lambda: any(e.kind == "lease.allocation_mismatch" for e in agent.events.since(0))
    )
    with pytest.raises(TtrpcError, match="no live lease"):
        await runtime.create_container(pod("lost", ""), "main", env)


async def test_a_container_without_the_marker_is_left_alone(
    agent: App, runtime: FakeNriRuntime
) -> None:
    made = await runtime.create_container(pod("sidecar", ""), "log", ["PATH=/bin"])
    assert made.env == {"PATH": "/bin"} and made.mounts == []


async def test_without_the_runtime_allocate_pairs_leases_again(
    agent: App, kubelet: FakeKubelet, runtime: FakeNriRuntime
) -> None:
    await runtime.stop()
    await eventually(lambda: agent.snapshot().injector == "device-plugin")
    lease_a = await admit(agent, "a", 4)
    env = dict(e.partition("=")[::2] for e in await allocated_env(kubelet, "a"))
    assert env["GPUSHARE_LEASE_ID"] == lease_a and "GPUSHARE_NRI" not in env
    await runtime.start()  # back: the plugin connects and registers again
    await eventually(lambda: agent.snapshot().injector == "nri", timeout=10)
    assert runtime.plugins == ["10-gpushare"] * 2  # registered once per connection


async def test_units_handed_out_under_nri_are_checked_again_once_it_is_gone(
    agent: App, kubelet: FakeKubelet, runtime: FakeNriRuntime
) -> None:
    first = await kubelet.allocate("ns", "a", "main", 1)  # under NRI: the marker
    assert first.error is None
    kubelet.release("ns", "a")  # that pod went: its units are free again
    await runtime.stop()
    await eventually(lambda: agent.snapshot().injector == "device-plugin")
    await admit(agent, "b", 4)  # b's lease waits for b's Allocate
    stolen = await kubelet.allocate("ns", "intruder", "main", 1)  # the same units
    assert stolen.device_ids == first.device_ids
    assert stolen.failed_at == "PreStartContainer", "the PodResources check must run again"


async def test_a_broken_frame_ends_the_session_and_the_plugin_registers_again(
    agent: App, runtime: FakeNriRuntime
) -> None:
    runtime.break_frame()
    await eventually(lambda: runtime.plugins == ["10-gpushare"] * 2, timeout=10)
    await eventually(lambda: agent.snapshot().injector == "nri")
