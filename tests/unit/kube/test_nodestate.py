"""The node state the cluster side publishes: the pure label and condition (tables), and
the publishing loop against a recording API (when it writes, what it skips, and how it
takes API errors)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from agent.admission.policy import Rules
from agent.api.proto import agent_pb2 as pb
from agent.core.units import GIB
from agent.kubeapi.port import KubeApi, KubeError, NotFound, Obj
from agent.legacy.cluster.agents import AgentLink
from agent.legacy.cluster.cache import AgentCache, NodeEntry
from agent.legacy.cluster.nodestate import (
    CONDITION,
    MESSAGE_MAX_CHARS,
    READY_LABEL,
    node_state,
    publish_node_states,
)

UUIDS = ("GPU-87bb7b7c-0000-0000-0000-000000000001", "GPU-96222f07-0000-0000-0000-000000000002")
NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
STAMP = "2030-01-02T03:04:05Z"
DETAIL = "drained: maintenance"


def answer(
    *, closed: tuple[str, ...] = ("", ""), lease_gib: int = 0, taken_at: float = 1.0
) -> pb.GetNodeResponse:
    """Two 80 GiB devices; ``closed``: each one's reason code ("" open); one lease of
    ``lease_gib`` and 25% threads on the first."""
    leases = []
    if lease_gib:
        leases.append(
            pb.Lease(
                lease_id="l-1", request_id="r-1", tenant="a", trust_domain="a",
                device_uuid=UUIDS[0], priority="burstable", memory_bytes=lease_gib * GIB,
                thread_pct=25, state="admitted", created_at=1.0, updated_at=1.0,
            )
        )  # fmt: skip
    return pb.GetNodeResponse(
        taken_at=taken_at,
        devices=[
            pb.Device(uuid=u, index=i, model="H100", memory_bytes=80 * GIB, sharing_mode="mps")
            for i, u in enumerate(UUIDS[: len(closed)])
        ],
        leases=leases,
        ledger=[
            pb.DeviceLedger(device_uuid=u, closed=c, closed_detail=c and DETAIL)
            for u, c in zip(UUIDS, closed, strict=False)
        ],
    )  # fmt: skip


# -- the pure function ---------------------------------------------------------------------

TABLE = [
    pytest.param(
        answer(lease_gib=20), "",
        "true", "True", "AgentReady",
        "GPU-87bb7b7c: 58.0 GiB, 175% threads free; GPU-96222f07: 78.5 GiB, 200% threads free",
        id="ready",
    ),
    pytest.param(
        answer(closed=("", "DRAINING")), "",
        "true", "True", "AgentReady",
        "GPU-87bb7b7c: 78.5 GiB, 200% threads free; GPU-96222f07: closed (drained: maintenance)",
        id="a-closed-device",
    ),
    pytest.param(
        answer(closed=("DEVICE_DEGRADED", "DRAINING")), "",
        "false", "False", "AgentNotReady",
        "every device is closed to new leases: GPU-87bb7b7c: closed (drained: maintenance); "
        "GPU-96222f07: closed (drained: maintenance)",
        id="every-device-closed",
    ),
    pytest.param(
        None, "UNAVAILABLE: connection refused",
        "false", "False", "AgentUnreachable",
        "the gpushare agent on gpu-1 does not answer: UNAVAILABLE: connection refused",
        id="agent-unreachable",
    ),
    pytest.param(
        None, "",
        "false", "False", "AgentUnreachable",
        "the gpushare agent on gpu-1 does not answer: not connected",
        id="never-connected",
    ),
    pytest.param(
        answer(closed=()), "",
        "false", "False", "AgentNotReady", "the gpushare agent reports no devices",
        id="no-devices",
    ),
    pytest.param(
        answer(lease_gib=79), "",
        "true", "True", "AgentReady",
        "GPU-87bb7b7c: 0 B, 175% threads free; GPU-96222f07: 78.5 GiB, 200% threads free",
        id="overcommitted-memory-shows-zero",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("snapshot", "error", "label", "status", "reason", "message"), TABLE)
def test_label_and_condition(
    snapshot: pb.GetNodeResponse | None,
    error: str,
    label: str,
    status: str,
    reason: str,
    message: str,
) -> None:
    labels, condition = node_state("gpu-1", snapshot, error, Rules(), now=NOW)
    assert labels == {READY_LABEL: label}
    assert condition == {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": STAMP,
        "lastTransitionTime": STAMP,
    }


def test_the_transition_time_moves_only_when_the_status_changes() -> None:
    _, first = node_state("gpu-1", answer(), "", Rules(), now=NOW)
    later = NOW + timedelta(minutes=5)
    _, same = node_state("gpu-1", answer(lease_gib=20), "", Rules(), now=later, previous=first)
    assert same["lastTransitionTime"] == STAMP  # free memory changed, the status did not
    assert same["lastHeartbeatTime"] == "2030-01-02T03:09:05Z"
    _, down = node_state("gpu-1", None, "DEADLINE_EXCEEDED", Rules(), now=later, previous=same)
    assert down["status"] == "False"
    assert down["lastTransitionTime"] == down["lastHeartbeatTime"] == "2030-01-02T03:09:05Z"
    _, still = node_state("gpu-1", answer(closed=()), "", Rules(), now=later, previous=down)
    assert still["reason"] == "AgentNotReady"  # another reason, the same status
    assert still["lastTransitionTime"] == down["lastTransitionTime"]


def test_the_rules_decide_what_is_free_and_the_message_is_bounded() -> None:
    rules = Rules(reserve_bytes=0, context_overhead_bytes=0, thread_budget_pct=100)
    _, condition = node_state("gpu-1", answer(closed=("",)), "", rules, now=NOW)
    assert condition["message"] == "GPU-87bb7b7c: 80.0 GiB, 100% threads free"
    _, condition = node_state("gpu-1", None, "x" * 10_000, rules, now=NOW)
    assert len(condition["message"]) == MESSAGE_MAX_CHARS
    assert condition["message"].endswith("...")


# -- the loop --------------------------------------------------------------------------------


class RecordingApi:
    """``patch_node`` and ``patch_node_status`` as the loop calls them; ``fail`` maps a
    node name to the error its next writes raise."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Obj]] = []
        self.fail: dict[str, KubeError] = {}
        self.attempts = 0

    async def patch_node(self, name: str, patch: Obj) -> Obj:
        return self._record("labels", name, patch)

    async def patch_node_status(self, name: str, patch: Obj) -> Obj:
        return self._record("status", name, patch)

    def _record(self, what: str, name: str, patch: Obj) -> Obj:
        self.attempts += 1
        if name in self.fail:
            raise self.fail[name]
        self.writes.append((what, name, patch))
        return {}

    def conditions(self, name: str) -> list[dict[str, Any]]:
        return [
            p["status"]["conditions"][0] for w, n, p in self.writes if w == "status" and n == name
        ]

    def labels(self, name: str) -> list[str]:
        return [
            p["metadata"]["labels"][READY_LABEL]
            for w, n, p in self.writes
            if w == "labels" and n == name
        ]


class FakeLink:
    def __init__(self, node: pb.GetNodeResponse) -> None:
        self.target = "fake"
        self.node = node


def follow(cache: AgentCache, name: str, node: pb.GetNodeResponse) -> FakeLink:
    link = FakeLink(node)
    entry = NodeEntry(name, f"{name}:9807", link=cast(AgentLink, link), snapshot=node, error="")
    entry.ready.set()  # it answered once
    cache.nodes[name] = entry
    return link


async def until(what: Callable[[], bool], timeout_s: float = 3.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not what():
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def publishing(
    api: RecordingApi, cache: AgentCache, interval_s: float
) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(
        publish_node_states(
            cast(KubeApi, api), cache, Rules(), interval_s=interval_s, check_s=0.01
        ),
        name="node-states",
    )
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def no_connect(target: str) -> Any:
    raise AssertionError(f"the cache connects to nothing here ({target})")


async def test_a_status_change_is_written_soon_free_memory_waits_for_the_heartbeat() -> None:
    api, cache = RecordingApi(), AgentCache(no_connect)
    follow(cache, "gpu-1", answer())
    async with publishing(api, cache, interval_s=3600):
        await until(lambda: len(api.writes) == 2)
        assert api.labels("gpu-1") == ["true"]
        assert api.conditions("gpu-1")[0]["reason"] == "AgentReady"
        cache.nodes["gpu-1"].snapshot = answer(lease_gib=20, taken_at=2.0)  # memory only
        await asyncio.sleep(0.1)
        assert len(api.writes) == 2
        cache.nodes["gpu-1"].snapshot = answer(closed=("DRAINING", "DRAINING"), taken_at=3.0)
        await until(lambda: len(api.writes) == 4)
    assert api.labels("gpu-1") == ["true", "false"]
    first, second = api.conditions("gpu-1")
    assert second["reason"] == "AgentNotReady"
    assert second["lastTransitionTime"] >= first["lastTransitionTime"]


async def test_each_heartbeat_writes_the_condition_not_the_label_and_a_dead_agent_shows() -> None:
    api, cache = RecordingApi(), AgentCache(no_connect)
    follow(cache, "gpu-1", answer())
    async with publishing(api, cache, interval_s=0.05):
        await until(lambda: len(api.conditions("gpu-1")) >= 3)
        assert api.labels("gpu-1") == ["true"]
        entry = cache.nodes["gpu-1"]  # what the cache's own heartbeat marks when it fails
        entry.stale, entry.error = True, "connection refused"
        await until(lambda: api.conditions("gpu-1")[-1]["reason"] == "AgentUnreachable")
    condition = api.conditions("gpu-1")[-1]
    assert condition["message"].endswith("does not answer: connection refused")
    assert api.labels("gpu-1") == ["true", "false"]


async def test_a_missing_node_is_logged_once_and_other_errors_are_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, cache = RecordingApi(), AgentCache(no_connect)
    follow(cache, "gone", answer())
    follow(cache, "flaky", answer())
    api.fail["gone"] = NotFound(404, "NotFound", 'nodes "gone" not found')
    api.fail["flaky"] = KubeError(500, "InternalError", "etcd timeout")
    with caplog.at_level(logging.INFO, logger="agent.legacy.cluster.nodestate"):
        async with publishing(api, cache, interval_s=0.05) as task:
            await until(lambda: api.attempts >= 8)
            del api.fail["flaky"]
            await until(lambda: bool(api.conditions("flaky")))
            assert not task.done()
    missing = [r for r in caplog.records if "gone does not exist" in r.getMessage()]
    assert len(missing) == 1
    failed = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("node flaky" in m and "etcd timeout" in m for m in failed)
    assert api.labels("flaky") == ["true"] and not api.conditions("gone")


async def test_a_node_the_cache_stops_following_is_written_unreachable_once() -> None:
    api, cache = RecordingApi(), AgentCache(no_connect)
    follow(cache, "gpu-1", answer())
    follow(cache, "gpu-2", answer())
    async with publishing(api, cache, interval_s=3600):
        await until(lambda: len(api.writes) == 4)
        del cache.nodes["gpu-2"]
        await until(lambda: len(api.writes) == 6)
        await asyncio.sleep(0.05)
    assert len(api.writes) == 6
    assert api.labels("gpu-2") == ["true", "false"]
    last = api.conditions("gpu-2")[-1]
    assert last["reason"] == "AgentUnreachable"
    assert "no longer listed" in last["message"]


async def test_an_agent_not_reached_yet_is_left_alone_for_one_interval() -> None:
    api, cache = RecordingApi(), AgentCache(no_connect)
    cache.nodes["gpu-1"] = NodeEntry("gpu-1", "gpu-1:9807", error="UNAVAILABLE: refused")
    async with publishing(api, cache, interval_s=0.3):
        await asyncio.sleep(0.15)
        assert api.writes == []  # a restart of the cluster side does not flap the node
        await until(lambda: len(api.writes) == 2)
    assert api.labels("gpu-1") == ["false"]
    condition = api.conditions("gpu-1")[0]
    assert condition["reason"] == "AgentUnreachable"
    assert condition["message"].endswith("does not answer: UNAVAILABLE: refused")
