"""The learner's own edges (agent.learning.learner), with the training failing on purpose:
a retrain that raises, or a model that cannot be saved, keeps the current model and says
why; what a crash leaves is cleaned; a learned model that does not load, or a history that
does not read, is set aside; one retrain at a time; the periodic task skips a busy round."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.config import load_settings
from agent.core.errors import ConflictError
from agent.estimator import learning
from agent.estimator.learning import Retrained
from agent.estimator.model import DEFAULT_MODEL_DIR
from agent.learning.gate import ProfileGate
from agent.learning.learned import (
    ACTIVE,
    MODELS_KEPT,
    active_learned,
    learned_root,
    load_learned,
    prune,
)
from agent.learning.learner import Learner, in_daemon_thread
from agent.node.events import EventLog
from agent.state.port import RunRecordRow

RECORD = (
    '{"gpu": {"model": "H100", "memory_bytes": 85899345920}, "target": {"workload": "a", '
    '"thread_pct": 50, "memory_bytes": 1, "counters": {"sm_active": 0.5}}, "peers": [], '
    '"retention": 0.5}'
)


class Store:
    def __init__(self, count: int) -> None:
        self.rows = [RunRecordRow(float(i), "a", RECORD) for i in range(count)]

    async def run_records(self, *, limit: int = 20_000) -> list[RunRecordRow]:
        return self.rows[-limit:]


def learner(tmp_path: Path, records: int = 3, **settings: Any) -> tuple[Learner, EventLog]:
    values = {"estimator.retrain_min_records": 2, "estimator.base_data": "none", **settings}
    estimator = load_settings(overrides=values).estimator
    events = EventLog(clock=lambda: 1.0)
    gate = ProfileGate(None, {})
    made = Learner(
        store=Store(records),  # type: ignore[arg-type]
        gate=gate,
        events=events,
        settings=estimator,
        state_dir=str(tmp_path),
        clock=lambda: 1_800_000_000.0,
    )
    return made, events


def kinds(events: EventLog) -> list[tuple[str, str]]:
    return [(e.kind, e.attrs["reason"]) for e in events._unwritten]


async def test_too_few_records_train_nothing(tmp_path: Path) -> None:
    made, events = learner(tmp_path, records=1)
    answer = await made.retrain()
    assert not answer.swapped and answer.node_records == 1 and not answer.figures
    assert kinds(events) == [("estimator.kept", answer.reason)]
    assert "fewer than estimator.retrain_min_records (2)" in answer.reason
    assert made.history == []  # no training, no history entry


async def test_a_training_that_fails_keeps_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Retrained:
        raise ValueError("no samples")

    monkeypatch.setattr(learning, "retrain", broken)
    made, events = learner(tmp_path)
    answer = await made.retrain()
    assert not answer.swapped and answer.reason == "training failed: ValueError('no samples')"
    assert kinds(events) == [("estimator.kept", answer.reason)]
    assert json.loads((tmp_path / "estimator" / "history.json").read_text())[0]["swapped"] is False


async def test_a_model_that_cannot_be_saved_is_not_swapped_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(learning, "retrain", lambda *a, **k: Retrained(True, "better", {"x": 1.0}))

    def full_disk(_outcome: Retrained, directory: Path, **_kwargs: Any) -> Path:
        directory.mkdir()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(learning, "save_learned", full_disk)
    made, events = learner(tmp_path)
    answer = await made.retrain()
    assert not answer.swapped and not answer.model_dir
    assert "could not be saved" in answer.reason and "No space left" in answer.reason
    assert kinds(events) == [("estimator.kept", answer.reason)]
    assert made.history[-1]["swapped"] is False and made.history[-1]["reason"] == answer.reason
    assert active_learned(str(tmp_path)) is None


async def test_a_saved_model_is_moved_into_place_and_named_active(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(learning, "retrain", lambda *a, **k: Retrained(True, "better", {"x": 1.0}))

    def copy(_outcome: Retrained, directory: Path, **_kwargs: Any) -> Path:
        directory.mkdir()
        for name in ("model.json", "forest.npz"):
            (directory / name).write_bytes((DEFAULT_MODEL_DIR / name).read_bytes())
        return directory

    monkeypatch.setattr(learning, "save_learned", copy)
    made, events = learner(tmp_path)
    answer = await made.retrain()
    assert answer.swapped and answer.figures == {"x": 1.0}
    path = Path(answer.model_dir)
    assert path.parent == learned_root(str(tmp_path)) and not path.name.startswith(".")
    assert active_learned(str(tmp_path)) == path
    assert [k for k, _r in kinds(events)] == ["estimator.retrained"]
    assert events._unwritten[0].attrs["model_dir"] == str(path)
    loaded = load_learned(str(tmp_path))
    assert loaded is not None and loaded[1] == path


def test_only_the_newest_models_and_no_staging_folder_are_kept(tmp_path: Path) -> None:
    root = learned_root(str(tmp_path))
    names = [f"2026010{i}T000000Z-aaaaaa" for i in range(MODELS_KEPT + 2)]
    for name in [*names, ".staging-20260101T000000Z-bbbbbb"]:
        (root / name).mkdir(parents=True)
    prune(root, keep=root / names[0])  # the active one stays, however old
    left = sorted(p.name for p in root.iterdir())
    assert left == [names[0], *names[-MODELS_KEPT:]]


def test_a_learned_model_that_does_not_load_is_set_aside(tmp_path: Path) -> None:
    root = learned_root(str(tmp_path))
    assert load_learned(str(tmp_path)) is None  # none learned
    (root / "broken").mkdir(parents=True)
    (root / ACTIVE).write_text("broken")
    assert active_learned(str(tmp_path)) == root / "broken"
    assert load_learned(str(tmp_path)) is None


async def test_a_history_that_does_not_read_starts_again(tmp_path: Path) -> None:
    (tmp_path / "estimator").mkdir()
    (tmp_path / "estimator" / "history.json").write_text("{not json")
    made, _events = learner(tmp_path)
    await made.start()
    assert made.history == []
    (tmp_path / "estimator" / "history.json").write_text(json.dumps([{"swapped": True}, 3]))
    await made.start()
    assert made.history == [{"swapped": True}]


async def test_one_retrain_at_a_time_and_the_periodic_one_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow(*_args: Any, **_kwargs: Any) -> Retrained:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=4)
        return Retrained(False, "not better")

    monkeypatch.setattr(learning, "retrain", slow)
    made, _events = learner(tmp_path)
    first = asyncio.create_task(made.retrain())
    await asyncio.sleep(0)
    with pytest.raises(ConflictError, match="a retrain is running"):
        await made.retrain()
    caplog.set_level("INFO", logger="agent.learning.learner")
    periodic = asyncio.create_task(made.periodic(0.01))
    while "periodic retrain skipped" not in caplog.text:
        await asyncio.sleep(0.01)
    periodic.cancel()
    release.set()
    assert (await first).reason == "not better"
    await asyncio.gather(periodic, return_exceptions=True)


async def test_training_runs_on_a_daemon_thread_a_stop_does_not_wait_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []

    def where(*_args: Any, **_kwargs: Any) -> Retrained:
        seen.append(threading.current_thread().daemon)
        return Retrained(False, "not better")

    monkeypatch.setattr(learning, "retrain", where)
    made, _events = learner(tmp_path)
    assert (await made.retrain()).reason == "not better" and seen == [True]


async def test_a_daemon_thread_hands_back_what_it_raised() -> None:
    def boom() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        await in_daemon_thread(boom)
    assert await in_daemon_thread(sum, [1, 2]) == 3


async def test_a_caller_that_goes_away_leaves_the_attempt_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow(*_args: Any, **_kwargs: Any) -> Retrained:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=4)
        return Retrained(False, "not better", {"candidate_mae": 0.2})

    monkeypatch.setattr(learning, "retrain", slow)
    made, events = learner(tmp_path)
    caller = asyncio.create_task(made.retrain())
    await asyncio.sleep(0.05)
    caller.cancel()  # an RPC deadline, a client gone
    with pytest.raises(asyncio.CancelledError):
        await caller
    with pytest.raises(ConflictError, match="a retrain is running"):
        await made.retrain()  # the first attempt still runs: no second one beside it
    release.set()
    while not kinds(events):
        await asyncio.sleep(0.01)
    assert kinds(events) == [("estimator.kept", "not better")]
    history = json.loads((tmp_path / "estimator" / "history.json").read_text())
    assert [h["reason"] for h in history] == ["not better"]
    monkeypatch.setattr(learning, "retrain", lambda *a, **k: Retrained(False, "again"))
    assert (await made.retrain()).reason == "again", "the next attempt may start"


async def test_a_history_that_cannot_be_written_leaves_the_attempt_standing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(learning, "retrain", lambda *a, **k: Retrained(False, "not better"))
    made, events = learner(tmp_path)
    (tmp_path / "estimator").mkdir()
    (tmp_path / "estimator" / "history.json").mkdir()  # a folder where the file goes
    answer = await made.retrain()
    assert answer.reason == "not better"
    assert kinds(events) == [("estimator.kept", "not better")]
