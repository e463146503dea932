"""The taints a device is published with (KEP-5055): ``NoSchedule`` for a device closed to
new shares (drained, degraded, its MPS daemon down, a fault), ``NoExecute`` for a GPU that
is gone (the eviction controller then evicts the pods using it), and a ``NoSchedule``
``gpushare.io/refused`` for a while after the agent refused a share on it at its binding.
Pure functions first, then the real agent publishing to the API stand-in, its janitor
finding a GPU gone."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest

from agent.admission.policy import DeviceView, Rules
from agent.claims.inventory import device_health, inventory, taints
from agent.config.dra import DraSettings
from agent.core.types import Device, ReasonCode
from agent.core.units import GIB, MIB
from agent.dra.port import Health
from agent.dra.publisher import SlicePublisher
from agent.dra.slices import Capacity, SliceDevice, Taint
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.kubeapi.rest import RestKubeApi
from agent.mps.fake import FakeMpsManager
from agent.node.availability import GONE_DETAIL
from agent.runtime.app import Ports
from tests.helpers import running_app, sim_settings
from tests.kubeworld.apiserver import FakeApiServer

RULES = Rules(reserve_bytes=GIB, context_overhead_bytes=512 * MIB, thread_budget_pct=200)
DRA = DraSettings(refusal_backoff_s=10.0)
H100 = Device("GPU-a", 0, "H100-SXM5-80GB", 80 * GIB)
XID_79 = "gpu.xid: gpu.xid on GPU-a: data 79"  # the janitor's closure of NVML's event
XID_13 = "gpu.xid: gpu.xid on GPU-a: data 13"  # a graphics engine exception: the GPU stays


def published(view: DeviceView) -> list[tuple[str, str, str]]:
    return [(t.key, t.effect, t.value) for t in taints(view)]


@pytest.mark.parametrize(
    ("closed", "detail", "expected"),
    [
        (None, "", []),
        (ReasonCode.DRAINING, "drained: maintenance", [("drained", "NoSchedule", "draining")]),
        (ReasonCode.DEVICE_DEGRADED, "w windows", [("degraded", "NoSchedule", "device_degraded")]),
        (
            ReasonCode.DEVICE_UNAVAILABLE,
            "MPS control daemon is down (exited)",
            [("mps-down", "NoSchedule", "device_unavailable")],
        ),
        (ReasonCode.DEVICE_UNAVAILABLE, XID_13, [("fault", "NoSchedule", "device_unavailable")]),
        (
            ReasonCode.DEVICE_UNAVAILABLE,
            "mps.server_fatal: the server died",
            [("fault", "NoSchedule", "device_unavailable")],
        ),
        (
            ReasonCode.STORE_UNAVAILABLE,
            "failing closed",
            [("fault", "NoSchedule", "store_unavailable")],
        ),
        (ReasonCode.DEVICE_UNAVAILABLE, GONE_DETAIL, [("gone", "NoExecute", "not-listed")]),
        (ReasonCode.DEVICE_UNAVAILABLE, XID_79, [("gone", "NoExecute", "xid-79")]),
    ],
)
def test_only_a_gpu_that_is_gone_evicts_its_pods(
    closed: ReasonCode | None, detail: str, expected: list[tuple[str, str, str]]
) -> None:
    view = DeviceView(H100, closed=closed, closed_detail=detail)
    assert published(view) == [(f"gpushare.io/{k}", e, v) for k, e, v in expected]


def test_a_gone_gpu_is_unhealthy() -> None:
    view = DeviceView(H100, closed=ReasonCode.DEVICE_UNAVAILABLE, closed_detail=GONE_DETAIL)
    names = inventory([view], RULES, DRA).name_of
    [told] = device_health([view], "node-a", names)
    assert (told.health, told.message) == (Health.UNHEALTHY, GONE_DETAIL)


NOW_S = 1000.0  # monotonic
WALL_S = 1_796_000_000.0  # 2026-11-30T00:53:20Z


@pytest.mark.parametrize(
    ("deadline_s", "closed", "expected"),
    [
        (None, None, []),  # never refused
        (NOW_S + 4.0, None, [("gpushare.io/refused", "NoSchedule", "2026-11-30T00:53:14Z")]),
        (NOW_S, None, []),  # its back-off is over
        (NOW_S - 30.0, None, []),
        (
            NOW_S + 0.5,
            ReasonCode.DRAINING,
            [
                ("gpushare.io/drained", "NoSchedule", ""),
                ("gpushare.io/refused", "NoSchedule", "2026-11-30T00:53:10Z"),
            ],
        ),
    ],
)
def test_a_refused_device_is_tainted_until_its_back_off_ends(
    deadline_s: float | None, closed: ReasonCode | None, expected: list[tuple[str, str, str]]
) -> None:
    """The taint's time is when the share was refused: the deadline less the back-off."""
    refused = {} if deadline_s is None else {"gpu-0": deadline_s}
    other = dataclasses.replace(H100, uuid="GPU-b", index=1)
    views = [DeviceView(H100, closed=closed), DeviceView(other)]
    devices = inventory(
        views, RULES, DRA, refused_until=refused, now_s=NOW_S, wall_s=WALL_S
    ).devices
    assert [(t.key, t.effect, t.time_added) for t in devices[0].taints] == expected
    assert devices[1].taints == ()  # not the node's other devices


def test_without_a_wall_clock_the_api_server_times_the_refusal() -> None:
    devices = inventory(
        [DeviceView(H100)], RULES, DRA, refused_until={"gpu-0": NOW_S + 1}, now_s=NOW_S
    ).devices
    assert [(t.key, t.time_added) for t in devices[0].taints] == [("gpushare.io/refused", "")]


def test_devices_are_published_in_one_order_whatever_the_views_order() -> None:
    """MIG instances share their GPU's index: an unchanged node writes nothing only if
    they come out in the same order every time."""
    migs = [
        Device(f"MIG-{g}-{i}", g, "A100", 10 * GIB, parent_uuid=f"GPU-{g}", gpu_instance_id=i)
        for g in range(3)
        for i in range(1, 8)
    ]
    views = [DeviceView(d) for d in migs]
    first = [d.name for d in inventory(views, RULES, DRA).devices]
    for seed in range(5):
        random.Random(seed).shuffle(views)
        assert [d.name for d in inventory(views, RULES, DRA).devices] == first
    assert first[:8] == [f"gpu-0-mig-{i}" for i in range(1, 8)] + ["gpu-1-mig-1"]


# -- the taint's time across the pool's writes ------------------------------------------

CAPACITY = {"clients": Capacity("16", "1", valid_values=("1",))}


def device(name: str, *taint: Taint) -> SliceDevice:
    return SliceDevice(name, attributes={"index": 0}, capacity=CAPACITY, taints=taint)


async def test_a_taint_keeps_its_time_when_the_pool_is_written_again() -> None:
    """A NoExecute toleration's seconds count from the taint's ``timeAdded``: a taint the
    driver leaves untimed (the API server times it) keeps the time it was first stored
    with, whatever else changes in the pool."""
    async with FakeApiServer(token="t") as api:
        api.create_node("node-a")
        async with RestKubeApi.from_url(api.url, token="t", timeout_s=2.0) as kube:
            slices = SlicePublisher(kube, driver="gpushare.io", node="node-a")
            first = Taint("gpushare.io/gone", "NoExecute", "not-listed", "2026-12-06T01:00:00Z")
            slices.publish([device("gpu-0", first), device("gpu-1")])
            await slices.sync_once()
            untimed = dataclasses.replace(first, time_added="")
            drained = Taint("gpushare.io/drained", "NoSchedule")
            slices.publish([device("gpu-0", untimed), device("gpu-1", drained)])
            assert await slices.sync_once() is True
            [stored] = api.objects("resourceslices")
            gone = stored["spec"]["devices"][0]["taints"][0]
            assert gone["timeAdded"] == "2026-12-06T01:00:00Z"


# -- the real agent: its janitor finds a GPU gone -----------------------------------------


def taints_of(api: FakeApiServer) -> dict[str, list[tuple[str, str]]]:
    return {
        d["name"]: [(t["key"], t["effect"]) for t in d.get("taints") or []]
        for s in api.objects("resourceslices")
        for d in s["spec"]["devices"]
    }


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_a_gpu_gone_from_the_node_is_published_no_execute_until_it_is_back(
    root: Path, api: FakeApiServer, driver_settings: dict[str, object]
) -> None:
    gpu = FakeGpuBackend.with_gpus(2)
    ports = Ports(gpu=gpu, mps=FakeMpsManager(), telemetry=[FakeTelemetrySource()], simulated=True)
    settings = sim_settings(
        root,
        **{
            "estimator.model_dir": "none",
            "janitor.interval_s": 3600,
            **driver_settings,
        },
    )
    async with running_app(settings, ports) as app:
        assert app.control is not None
        await until(lambda: taints_of(api) == {"gpu-0": [], "gpu-1": []})
        unplugged = gpu.unplug(app.devices[1].uuid)  # off the bus
        await app.control.janitor.pass_once(dry_run=False)
        gone = {"gpu-0": [], "gpu-1": [("gpushare.io/gone", "NoExecute")]}
        await until(lambda: taints_of(api) == gone)
        gpu.plug(unplugged)
        await app.control.janitor.pass_once(dry_run=False)
        await until(lambda: taints_of(api) == {"gpu-0": [], "gpu-1": []})
