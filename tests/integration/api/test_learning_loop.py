"""The learning loop on a running agent with the real retrain: workloads on the simulated
node report progress at the rates its contention model gives them (alone, and in pairs);
the agent makes run records of it, a retrain replaces a deliberately wrong model with one
learned from them (saved under the state directory, used by the gate at once and after a
restart), and a retrain that does not beat the model in use keeps it. Two retrains at once:
the second is refused while the first runs. A bad ``estimator.base_data`` stops the start."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import grpc.aio
import pytest

from agent.client import AgentClient, Priority
from agent.config import Settings
from agent.core.errors import ConfigError
from agent.estimator.model import RetentionModel
from agent.estimator.records import Workload, to_json
from agent.estimator.training import save, train
from agent.learning.learned import active_learned, history_path
from agent.runtime.app import App
from agent.sim.contention import Load, retentions
from agent.sim.synth import runs, workloads
from tests.helpers import FakeClock, running_app, short_dir, sim_settings

pytestmark = pytest.mark.timeout(300)
SOLO_S = 2.0  # seconds of each window the test reports over (the progress window is 1 s)
UNITS_PER_S = 100.0  # a workload's speed alone on a whole device


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def wrong_model(folder: Path) -> Path:
    """A model of the world upside down: sets that keep their speed labelled as losing it."""
    upside_down = [
        replace(r, retention=round(1.2 - (r.retention or 0.0), 4))
        for r in runs(150, seed=3, workload_count=10)
    ]
    result = train(upside_down, folds=4, trees=15, check_constraints=False)
    save(result, folder, data_sha256="wrong", records=len(upside_down), provenance="wrong")
    return folder


def settings_for(root: Path) -> Settings:
    base = root / "base.jsonl"
    base.write_text("".join(to_json(r) + "\n" for r in runs(60, seed=5, workload_count=8)))
    return sim_settings(
        root,
        **{
            "estimator.model_dir": str(wrong_model(root / "wrong-model")),
            "estimator.base_data": str(base),
            "estimator.progress_window_s": 1.0,
            "estimator.retrain_min_records": 30,
        },
    )


def speed(load: Load, peers: list[Load]) -> float:
    """Units a second of ``load`` next to ``peers``, by the simulated node's contention
    model (alone at its own thread share: ``peers`` empty)."""
    return UNITS_PER_S * retentions([load, *peers])[0]


class Workloads:
    """Leases of the simulated node's workloads, reporting what they would do."""

    def __init__(self, agent: AgentClient, monotonic: FakeClock) -> None:
        self.agent = agent
        self.monotonic = monotonic
        self.units: dict[str, float] = {}

    async def admit(self, workload: Workload, thread_pct: float) -> tuple[str, Load]:
        answer = await self.agent.admit(
            tenant="t", trust_domain="t", priority=Priority.BURSTABLE,
            memory_bytes=workload.memory_bytes, thread_pct=thread_pct,
            profile=workload.workload, counters=dict(workload.counters),
        )  # fmt: skip
        assert answer.decision.admitted, answer.decision.message
        lease_id = answer.lease.lease_id
        self.units[lease_id] = 0.0
        return lease_id, Load(workload.counters, thread_pct, workload.memory_bytes)

    async def run(self, speeds: dict[str, float]) -> None:
        """A window: each lease reports, then again SOLO_S later at its speed."""
        for lease_id in speeds:
            await self.agent.report_progress(lease_id, self.units[lease_id])
        self.monotonic.advance(SOLO_S)
        for lease_id, units_per_s in speeds.items():
            self.units[lease_id] += units_per_s * SOLO_S
            await self.agent.report_progress(lease_id, self.units[lease_id])


async def pair_round(
    node: Workloads, a: Workload, b: Workload, threads: tuple[float, float]
) -> None:
    """A alone, then A and B together, then B alone: a record of each."""
    lease_a, load_a = await node.admit(a, threads[0])
    await node.run({lease_a: speed(load_a, [])})
    lease_b, load_b = await node.admit(b, threads[1])
    await node.run({lease_a: speed(load_a, [load_b]), lease_b: speed(load_b, [load_a])})
    await node.agent.release(lease_a)
    await node.run({lease_b: speed(load_b, [])})
    await node.agent.release(lease_b)


async def stored(app: App, count: int) -> int:
    for _ in range(300):
        if await app.store.run_record_count() >= count:
            break
        await asyncio.sleep(0.01)
    return await app.store.run_record_count()


async def events_of(app: App, kind: str, count: int) -> list[dict[str, str]]:
    for _ in range(300):
        found = [dict(e.attrs) for e in app.events.since(0) if e.kind == kind]
        if len(found) >= count:
            return found
        await asyncio.sleep(0.01)
    return [dict(e.attrs) for e in app.events.since(0) if e.kind == kind]


async def test_a_wrong_model_is_replaced_by_one_learned_on_the_node_and_kept(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(root)
    pool = workloads(10, random.Random(11))
    rng = random.Random(12)
    monotonic = FakeClock(1000.0)
    async with running_app(settings, monotonic=monotonic) as app:
        wrong = app.gate.model
        async with AgentClient(f"unix:{settings.unix_socket_path}", attempts=1) as agent:
            node = Workloads(agent, monotonic)
            for _ in range(20):
                a, b = rng.sample(pool, 2)
                await pair_round(node, a, b, (rng.choice([50.0, 100.0]), 100.0))
            assert await stored(app, 40) == 40
            learned = await agent.retrain_estimator()
            assert learned.swapped, learned.reason
            assert learned.node_records == 40 and learned.figures["families"] == 10
            assert learned.figures["candidate_mae"] < learned.figures["current_mae"]
            path = Path(learned.model_dir)
            assert path == active_learned(settings.paths.state_dir)
            assert path.parent.parent == Path(settings.paths.state_dir) / "estimator"
            assert app.gate.model is not wrong and app.gate.model is not None
            assert "learned on the node" in app.gate.name

            # Nothing new to learn: the model in use is not beaten, and stays. A second
            # retrain asked meanwhile is refused.
            first, second = await asyncio.gather(
                agent.retrain_estimator(), agent.retrain_estimator(), return_exceptions=True
            )
            refused = [x for x in (first, second) if isinstance(x, grpc.aio.AioRpcError)]
            [kept] = [x for x in (first, second) if not isinstance(x, BaseException)]
            assert [x.code() for x in refused] == [grpc.StatusCode.FAILED_PRECONDITION]
            assert "a retrain is running" in str(refused[0].details())
            assert not kept.swapped and not kept.model_dir, kept.reason
            assert active_learned(settings.paths.state_dir) == path
        [retrained] = await events_of(app, "estimator.retrained", 1)
        [held] = await events_of(app, "estimator.kept", 1)
    assert retrained["model_dir"] == str(path) and float(retrained["candidate_mae"]) > 0
    assert retrained["node_records"] == "40" and retrained["reason"] == learned.reason
    assert held["reason"] == kept.reason and "model_dir" not in held
    history = json.loads(history_path(settings.paths.state_dir).read_text())
    assert [x["swapped"] for x in history] == [True, False]
    assert [x["node_records"] for x in history] == [40, 40]
    saved = RetentionModel.load(path)
    assert saved.metadata["learning"]["history"][0]["swapped"] is True

    caplog.set_level(logging.INFO, logger="agent.learning")
    async with running_app(settings) as again:  # a restart uses the learned model
        assert again.learned == path
        assert "learned on the node" in again.gate.name
    assert any(f"was learned on this node: {path}" in r.getMessage() for r in caplog.records)


async def test_a_bad_base_data_file_stops_the_start_naming_the_setting(root: Path) -> None:
    (root / "base.jsonl").write_text('{"gpu": {"model": "x"}}\n')
    settings = sim_settings(root, **{"estimator.base_data": str(root / "base.jsonl")})
    with pytest.raises(ConfigError, match=r"estimator\.base_data: .*base\.jsonl: line 1"):
        async with running_app(settings):
            pass
    missing = sim_settings(root, **{"estimator.base_data": str(root / "missing.jsonl")})
    with pytest.raises(ConfigError, match=r"estimator\.base_data: cannot read .*missing"):
        async with running_app(missing):
            pass
