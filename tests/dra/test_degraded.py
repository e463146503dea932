"""A device the w-window degradation rule closes is published with its taint, and takes no
new share; once it recovers the taint goes. The agent runs in this event loop (its clock
and counters driven by the test, as in the control-loop scenarios) as the node's DRA
driver, publishing to the API stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.core.types import ReasonCode
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import Ports
from agent.runtime.wiring import SimCounters
from tests.dra.fixtures import NODE
from tests.helpers import FakeClock, running_app, sim_settings
from tests.integration.control.test_scenarios import WINDOW_S, Node, signature, three_tenants
from tests.kubeworld.apiserver import FakeApiServer
from tests.kubeworld.cluster.dra import DEVICE_CLASS
from tests.kubeworld.scheduler.allocator import AllocationError, allocate


@pytest.fixture
def api(api: FakeApiServer) -> FakeApiServer:
    """The API stand-in with the DeviceClass as shipped."""
    api.put_object("deviceclasses", DEVICE_CLASS)
    return api


@pytest.fixture
async def sim(root: Path, driver_settings: dict[str, object]) -> AsyncIterator[Node]:
    clock, counters = FakeClock(), SimCounters()
    ports = Ports(
        gpu=FakeGpuBackend.with_gpus(1),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource(counters, clock=clock)],
        simulated=True,
    )
    settings = sim_settings(
        root,
        **{
            "estimator.model_dir": "none",
            "telemetry.sample_interval_s": WINDOW_S,
            "telemetry.window_s": WINDOW_S,
            "telemetry.stale_after_s": 3 * WINDOW_S,
            "janitor.interval_s": 3600,
            "janitor.exit_grace_s": 30,
            "readiness.interval_s": 3600,
            "readiness.deadline_s": 600,
            "readiness.policy": "reclaim",
            "degradation.windows": 3,
            "degradation.cooldown_windows": 3,
            **driver_settings,
        },
    )
    async with running_app(settings, ports, clock=clock) as app:
        yield Node(app, clock, counters)


def published(api: FakeApiServer) -> dict[str, Any]:
    [found] = api.objects("resourceslices")
    return dict(found["spec"]["devices"][0])


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


def new_share(api: FakeApiServer) -> list[dict[str, Any]]:
    claim = {
        "metadata": {"name": "late", "namespace": "a", "uid": "u-late"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpushare.io"}}]
            }
        },
    }
    return allocate(
        [claim], NODE, slices=api.objects("resourceslices"), classes=api.objects("deviceclasses")
    )


async def test_a_degraded_device_is_tainted_takes_no_share_and_recovers(
    sim: Node, api: FakeApiServer
) -> None:
    await until(lambda: bool(api.objects("resourceslices")))
    assert "taints" not in published(api)
    _protected, _older, younger = await three_tenants(sim)
    client = 2**22 + 99
    sim.fake_mps.connect(sim.device, client)
    younger = await sim.node.mark_ready(younger, [client])  # type: ignore[assignment]
    assert younger is not None
    sim.counters.behaviour[younger.lease_id] = signature(0.5, 0.05)  # five times busier
    for _ in range(3):  # w = 3 windows under the floor, each seen by the rule
        await sim.windows(1)
    assert sim.closed() is ReasonCode.DEVICE_DEGRADED
    await until(lambda: bool(published(api).get("taints")))
    [taint] = published(api)["taints"]
    assert (taint["key"], taint["effect"]) == ("gpushare.io/degraded", "NoSchedule")
    assert published(api)["attributes"]["retentionHeadroom"] == {"string": "degraded"}
    with pytest.raises(AllocationError):  # the scheduler has nowhere to put a new share
        new_share(api)
    for _ in range(3):  # the culprit was evicted: w windows later it recovers
        await sim.windows(1)
    assert sim.closed() is None
    await until(lambda: not published(api).get("taints"))
    assert new_share(api)


async def test_the_driver_says_how_it_goes_in_metrics(sim: Node, api: FakeApiServer) -> None:
    await until(lambda: bool(api.objects("resourceslices")))
    registry = sim.app.registry

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels or None)

    await until(lambda: (value("gpushare_dra_slice_writes_total") or 0) >= 1)
    assert value("gpushare_dra_registered") == 0.0  # no kubelet here
    assert sim.app.snapshot().injector == "dra (not registered with the kubelet)"
    assert value("gpushare_dra_slice_generation") == published_generation(api)
    assert value("gpushare_dra_prepares_total", result="done") == 0.0
    assert value("gpushare_dra_binding_answers_total", condition="refused") == 0.0


def published_generation(api: FakeApiServer) -> float:
    [found] = api.objects("resourceslices")
    return float(found["spec"]["pool"]["generation"])
