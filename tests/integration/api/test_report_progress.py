"""ReportProgress and RetrainEstimator on a running agent, over its real listeners: a
report is answered with what was measured, refused for an unknown or ended lease
(NOT_FOUND), for a malformed or backwards count (INVALID_ARGUMENT) and for another
caller's lease (PERMISSION_DENIED); the local socket may report on every lease.
Progress next to another lease and alone becomes a stored run record (counted by
``gpushare_estimator_node_records_total``); RetrainEstimator is admin only and, with too
few records, trains nothing and says so in its answer and an ``estimator.kept`` event."""

from __future__ import annotations

import asyncio
import math
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from prometheus_client import generate_latest

from agent.client import AgentClient, Priority
from agent.estimator.records import parse_lines
from agent.runtime.app import App
from tests.helpers import FakeClock, running_app, short_dir, sim_settings

GiB = 2**30
NAMES = ("alice", "bob")
REQUEST = {"tenant": "team-a", "trust_domain": "team-a", "priority": Priority.BURSTABLE,
           "memory_bytes": 4 * GiB, "thread_pct": 25, "profile": "resnet50"}  # fmt: skip
Agent = tuple[App, dict[str, str], FakeClock]


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture
async def agent(root: Path) -> AsyncIterator[Agent]:
    tokens = {name: secrets.token_hex(32) for name in NAMES}
    path = root / "tokens"
    path.write_text("".join(f"{name} {token}\n" for name, token in tokens.items()))
    os.chmod(path, 0o600)
    settings = sim_settings(
        root,
        **{
            "api.tcp_listen": "127.0.0.1:0",
            "api.token_file": str(path),
            "api.insecure_loopback": True,
            "estimator.progress_window_s": 1.0,
            "estimator.base_data": "none",
            "estimator.retrain_min_records": 5,
        },
    )
    monotonic = FakeClock(1000.0)
    async with running_app(settings, monotonic=monotonic) as app:
        yield app, tokens, monotonic


def client(app: App, tokens: dict[str, str], name: str) -> AgentClient:
    return AgentClient(f"127.0.0.1:{app.tcp_port}", token=tokens[name], attempts=1)


def local(app: App) -> AgentClient:
    return AgentClient(f"unix:{app.settings.unix_socket_path}", attempts=1)


async def refused(call: object, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    assert caught.value.code() is code, caught.value
    return str(caught.value.details())


async def test_a_report_is_answered_with_what_was_measured(agent: Agent) -> None:
    app, tokens, monotonic = agent
    async with client(app, tokens, "alice") as alice:
        lease = (await alice.admit(**REQUEST)).lease
        first = await alice.report_progress(lease.lease_id, 0)
        assert (first.lease_id, first.window_s, first.rate_per_s, first.peers) == (
            lease.lease_id, 0.0, 0.0, 0,
        )  # fmt: skip
        monotonic.advance(0.5)
        short = await alice.report_progress(lease.lease_id, 5)
        assert (short.window_s, short.rate_per_s) == (0.5, 0.0)  # under progress_window_s
        monotonic.advance(1.5)
        measured = await alice.report_progress(lease.lease_id, 40)
        assert (measured.window_s, measured.rate_per_s, measured.records) == (2.0, 20.0, 0)


@pytest.mark.parametrize(
    ("units", "message"),
    [
        (-1.0, "units_done: must be a finite number >= 0"),
        (math.nan, "units_done: must be a finite number >= 0"),
        (math.inf, "units_done: must be a finite number >= 0"),
        (9.0, "units_done: went backwards: 9 after 10"),
    ],
)
async def test_a_malformed_or_backwards_count_is_invalid_argument(
    agent: Agent, units: float, message: str
) -> None:
    app, tokens, _monotonic = agent
    async with client(app, tokens, "alice") as alice:
        lease = (await alice.admit(**REQUEST)).lease
        await alice.report_progress(lease.lease_id, 10)
        details = await refused(
            alice.report_progress(lease.lease_id, units), grpc.StatusCode.INVALID_ARGUMENT
        )
        assert message in details
        await refused(alice.report_progress("", 1), grpc.StatusCode.INVALID_ARGUMENT)


async def test_an_unknown_or_ended_lease_is_not_found(agent: Agent) -> None:
    app, tokens, _monotonic = agent
    async with client(app, tokens, "alice") as alice:
        details = await refused(
            alice.report_progress("l-AAAAAAAAAAAAAAAA", 1), grpc.StatusCode.NOT_FOUND
        )
        assert "no lease 'l-AAAAAAAAAAAAAAAA' on this node" in details
        lease = (await alice.admit(**REQUEST)).lease
        await alice.release(lease.lease_id)
        details = await refused(alice.report_progress(lease.lease_id, 1), grpc.StatusCode.NOT_FOUND)
        assert f"lease {lease.lease_id} is released on this node" in details


async def test_only_the_owner_or_the_local_socket_reports(agent: Agent) -> None:
    app, tokens, _monotonic = agent
    async with client(app, tokens, "alice") as alice, client(app, tokens, "bob") as bob:
        mine = (await alice.admit(**REQUEST)).lease
        details = await refused(
            bob.report_progress(mine.lease_id, 1), grpc.StatusCode.PERMISSION_DENIED
        )
        assert "another caller" in details and "alice" not in details
        await alice.report_progress(mine.lease_id, 1)
        async with local(app) as oncall:
            assert (await oncall.report_progress(mine.lease_id, 2)).lease_id == mine.lease_id


async def stored(app: App, count: int) -> int:
    """The run records in the store, once there are ``count`` (the writer is a task)."""
    for _ in range(200):
        found = await app.store.run_record_count()
        if found >= count:
            return found
        await asyncio.sleep(0.01)
    return await app.store.run_record_count()


async def test_progress_next_to_a_peer_and_alone_becomes_a_stored_record(agent: Agent) -> None:
    app, tokens, monotonic = agent
    async with client(app, tokens, "alice") as alice, client(app, tokens, "bob") as bob:
        a = (await alice.admit(**REQUEST)).lease
        await alice.report_progress(a.lease_id, 0)
        monotonic.advance(2)
        await alice.report_progress(a.lease_id, 40)  # alone: 20 units/s
        b = (await bob.admit(**{**REQUEST, "profile": "bert"})).lease
        assert b.device_uuid == a.device_uuid  # best-fit: next to a
        await alice.report_progress(a.lease_id, 40)
        monotonic.advance(2)
        together = await alice.report_progress(a.lease_id, 70)  # next to b: 15 units/s
        assert (together.peers, together.rate_per_s) == (1, 15.0)
        await bob.release(b.lease_id)  # the window closes: a record
        assert await stored(app, 1) == 1
        [row] = await app.store.run_records()
        [record] = parse_lines([row.record], need_retention=True)
        assert row.family == "resnet50" and record.retention == 0.75
        assert [p.workload for p in record.peers] == ["bert"]
        assert (await alice.report_progress(a.lease_id, 70)).records == 1
    metrics = generate_latest(app.registry).decode()
    assert "\ngpushare_estimator_node_records_total 1.0\n" in metrics


async def test_retrain_is_admin_only_and_says_when_records_are_too_few(agent: Agent) -> None:
    app, tokens, _monotonic = agent
    async with client(app, tokens, "alice") as alice:
        details = await refused(alice.retrain_estimator(), grpc.StatusCode.PERMISSION_DENIED)
        assert "only on the agent's local Unix socket" in details
    async with local(app) as oncall:
        answer = await oncall.retrain_estimator()
    assert not answer.swapped and answer.node_records == 0 and not answer.model_dir
    assert "fewer than estimator.retrain_min_records (5): no training" in answer.reason
    kept = [e for e in app.events.since(0) if e.kind == "estimator.kept"]
    for _ in range(100):
        if kept:
            break
        await asyncio.sleep(0.01)
        kept = [e for e in app.events.since(0) if e.kind == "estimator.kept"]
    [event] = kept
    assert event.attrs["node_records"] == "0" and "no training" in event.attrs["reason"]


async def test_retrains_run_every_retrain_interval_s(root: Path) -> None:
    settings = sim_settings(
        root, **{"estimator.retrain_interval_s": 0.05, "estimator.base_data": "none"}
    )
    async with running_app(settings) as app:
        for _ in range(300):
            kept = [e for e in app.events.since(0) if e.kind == "estimator.kept"]
            if len(kept) >= 2:
                break
            await asyncio.sleep(0.01)
        assert len(kept) >= 2 and "no training" in kept[0].attrs["reason"]
        assert "estimator-retrain" in app.supervisor.names
