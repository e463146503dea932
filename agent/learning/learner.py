"""The retention estimator learns on the node: retrain on the node's own run records (plus
``estimator.base_data``), and swap the new model in only when it beats the current one.

- One retrain at a time (``RetrainEstimator``, or every ``estimator.retrain_interval_s``):
  asked while one runs, :class:`ConflictError` "a retrain is running". Training runs on a
  daemon thread, off the event loop: a stop does not wait for it.
- Fewer than ``estimator.retrain_min_records`` node records: no training; the answer says so.
- A model swapped in is saved and named active (``agent.learning.learned``: where learned
  models and the history live on disk) and given to the gate (admission and Explain use it
  from the next decision on). At start, the active learned model is used instead of
  ``estimator.model_dir``.
- Every attempt is an event: ``estimator.retrained`` (swapped) or ``estimator.kept``, with
  the reason and the figures. Attempts that trained are kept in the history and saved with
  each learned model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agent.aio.tasks import Supervisor
from agent.config.estimator import EstimatorSettings
from agent.core.errors import ConfigError, ConflictError, ValidationError
from agent.core.learning import RetrainAnswer
from agent.core.types import Device
from agent.estimator.model import RetentionModel
from agent.estimator.records import Record, family_of, parse_lines
from agent.gpu.sampler import Sampler
from agent.learning.gate import ProfileGate
from agent.learning.learned import HISTORY_KEPT, install, read_history, write_history
from agent.learning.progress import ProgressTracker
from agent.learning.runrecords import RunRecorder
from agent.node.events import EventLog
from agent.node.ledger import Ledger
from agent.state.port import RunRecordRow, StateStore

if TYPE_CHECKING:
    from agent.estimator.learning import Retrained

log = logging.getLogger(__name__)
T = TypeVar("T")


class BaseRecords:
    """``estimator.base_data``: 'default' (the synthetic records the shipped model was
    trained on), 'none', or a JSON Lines file of records with retentions."""

    KEY = "estimator.base_data"

    def __init__(self, setting: str) -> None:
        self.setting = setting

    def check(self) -> None:
        """Read a file now: ConfigError naming the setting if it is not good records."""
        if self.setting not in ("default", "none"):
            self.load()

    def load(self) -> list[Record]:
        if self.setting == "none":
            return []
        if self.setting == "default":
            from agent.sim.default_model import RUNS, SEED
            from agent.sim.synth import runs

            return runs(RUNS, seed=SEED)
        try:
            with open(self.setting) as lines:
                return parse_lines(lines, need_retention=True)
        except OSError as exc:
            raise ConfigError(self.KEY, f"cannot read {self.setting}: {exc.strerror}") from exc
        except ValidationError as exc:
            raise ConfigError(self.KEY, f"{self.setting}: {exc}") from exc


def parse_rows(rows: Sequence[RunRecordRow]) -> list[Record]:
    """The stored records (a row that no longer parses is skipped, and logged)."""
    records = []
    for row in rows:
        try:
            records.extend(parse_lines([row.record], need_retention=True))
        except ValidationError as exc:
            log.warning("a stored run record does not parse: %s", exc)
    return records


def _log_failure(task: asyncio.Task[RetrainAnswer]) -> None:
    """An attempt whose caller went away still has its failure said (and retrieved)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("a retrain failed: %s", task.exception())


async def _nothing_waits() -> bool:
    return True


async def in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a thread of its own that does not hold up the process's exit (a
    training can take minutes; a stop must not wait for it, as ``asyncio.run`` waits for
    ``to_thread``'s pool)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: tuple[T] | BaseException) -> None:
        if done.done():
            return  # the caller went away
        if isinstance(outcome, BaseException):
            done.set_exception(outcome)
        else:
            done.set_result(outcome[0])

    def run() -> None:
        outcome: tuple[T] | BaseException
        try:
            outcome = (fn(*args),)
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, name="estimator-retrain", daemon=True).start()
    return await done


class Learner:
    def __init__(
        self,
        *,
        store: StateStore,
        gate: ProfileGate,
        events: EventLog,
        settings: EstimatorSettings,
        state_dir: str,
        clock: Callable[[], float],
        written: Callable[[], Awaitable[bool]] = _nothing_waits,
    ) -> None:
        self._store = store
        self._written = written  # writes the records made so far (the recorder's flush)
        self._gate = gate
        self._events = events
        self._settings = settings
        self._state_dir = state_dir
        self._clock = clock
        self.base = BaseRecords(settings.base_data)
        self.history: list[dict[str, Any]] = []
        self._running: asyncio.Task[RetrainAnswer] | None = None

    async def start(self) -> None:
        """Check ``estimator.base_data`` (ConfigError) and read the history."""
        await asyncio.to_thread(self.base.check)
        self.history = await asyncio.to_thread(read_history, self._state_dir)

    # -- one attempt -----------------------------------------------------------------------

    async def retrain(self) -> RetrainAnswer:
        """Retrain now; ConflictError while another retrain runs. The attempt is a task of
        its own: a caller that goes away (a deadline, a cancelled RPC) leaves it to end,
        swap, write its history and tell its event, and no second attempt starts before it
        has (only the agent's stop, which ends the event loop, cuts it)."""
        if self._running is not None and not self._running.done():
            raise ConflictError("a retrain is running")
        self._running = asyncio.create_task(self._attempt_and_tell(), name="estimator-attempt")
        self._running.add_done_callback(_log_failure)
        return await asyncio.shield(self._running)

    async def _attempt_and_tell(self) -> RetrainAnswer:
        answer = await self._attempt()
        self._tell(answer)
        return answer

    async def _attempt(self) -> RetrainAnswer:
        await self._written()  # a record made just before is trained on (if it can be)
        rows = await self._store.run_records()
        least = self._settings.retrain_min_records
        if len(rows) < least:
            reason = (
                f"{len(rows)} node run record(s), fewer than estimator.retrain_min_records "
                f"({least}): no training"
            )
            return RetrainAnswer(False, reason, len(rows))
        current = self._gate.model
        outcome, families = await in_daemon_thread(self._train, current, rows)
        attempt = self._remember(outcome, len(rows), families)  # saved with a new model
        model_dir = ""
        if outcome.swapped:
            model_dir = await self._swap(outcome)
            attempt.update(swapped=outcome.swapped, reason=outcome.reason)
        try:
            await asyncio.to_thread(write_history, self._state_dir, self.history)
        except OSError as exc:  # the attempt stands (and its model, if swapped in)
            log.warning("the retrain history could not be written: %s", exc)
        figures = {k: float(v) for k, v in outcome.figures.items()}
        return RetrainAnswer(outcome.swapped, outcome.reason, len(rows), figures, model_dir)

    async def _swap(self, outcome: Retrained) -> str:
        """Save the new model and give it to the gate; the folder it is in. A model that
        cannot be saved is not swapped in (``outcome`` says so)."""
        try:
            model, path = await asyncio.to_thread(
                install,
                outcome,
                self._state_dir,
                history=list(self.history),
                clock=self._clock,
            )
        except (OSError, ValueError, ValidationError) as exc:
            log.exception("the retrained model could not be saved")
            outcome.swapped = False
            outcome.reason = f"the new model beat the current one but could not be saved: {exc}"
            return ""
        self._gate.use_model(model)
        return str(path)

    def _train(
        self, current: RetentionModel | None, rows: Sequence[RunRecordRow]
    ) -> tuple[Retrained, int]:
        """On a thread: the node's records and the base records, trained; a failure is an
        outcome that keeps the current model."""
        from agent.estimator.learning import Retrained, retrain

        node = parse_rows(rows)
        families = len({family_of(r.target) for r in node})
        try:
            outcome = retrain(
                current,
                node,
                self.base.load(),
                gate_precision=self._settings.gate_precision,
            )
        except Exception as exc:  # scikit-learn's: any failure keeps the current model
            log.exception("retraining the retention model failed")
            outcome = Retrained(False, f"training failed: {exc!r}")
        return outcome, families

    def _remember(self, outcome: Retrained, node_records: int, families: int) -> dict[str, Any]:
        attempt: dict[str, Any] = {
            "at": self._clock(),
            "node_records": node_records,
            "families": families,
            "swapped": outcome.swapped,
            "reason": outcome.reason,
            "figures": {k: float(v) for k, v in outcome.figures.items()},
        }
        self.history.append(attempt)
        del self.history[:-HISTORY_KEPT]

        return attempt

    # -- telling ---------------------------------------------------------------------------

    def _tell(self, answer: RetrainAnswer) -> None:
        attrs = {
            "reason": answer.reason,
            "node_records": str(answer.node_records),
            **{name: f"{value:g}" for name, value in sorted(answer.figures.items())},
        }
        if answer.swapped:
            attrs["model_dir"] = answer.model_dir
            kind = "estimator.retrained"
            message = f"retention model retrained on the node and swapped in: {answer.reason}"
        else:
            kind, message = "estimator.kept", f"retention model kept: {answer.reason}"
        log.info("%s", message)
        self._events(kind, message, attrs=attrs)

    # -- the periodic task -----------------------------------------------------------------

    async def periodic(self, interval_s: float) -> None:
        """Retrain every ``interval_s`` (a supervised task); a retrain asked for meanwhile
        makes that round skip."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.retrain()
            except ConflictError:
                log.info("periodic retrain skipped: a retrain is running")
            except Exception:  # the next round tries again
                log.exception("periodic retrain failed")


@dataclass
class NodeLearning:
    """The learning loop as the App holds it: run records in, retrained models out."""

    recorder: RunRecorder
    learner: Learner


async def start_learning(
    settings: EstimatorSettings,
    *,
    state_dir: str,
    store: StateStore,
    gate: ProfileGate,
    events: EventLog,
    ledger: Ledger,
    devices: Sequence[Device],
    sampler: Sampler,
    supervisor: Supervisor,
    clock: Callable[[], float],
    monotonic: Callable[[], float],
    learned: Path | None,
) -> NodeLearning:
    """Run records from progress reports, and the retrains that learn from them (once the
    ledger is loaded; before the API serves). ConfigError: a bad ``estimator.base_data``."""
    e = settings
    tracker = ProgressTracker(
        clock=monotonic, min_span_s=e.progress_window_s, workload_of=gate.lease_workload
    )
    recorder = RunRecorder(tracker, store=store, devices=devices, ledger=ledger, clock=clock)
    learner = Learner(
        store=store,
        gate=gate,
        events=events,
        settings=e,
        state_dir=state_dir,
        clock=clock,
        written=recorder.flush,
    )
    await learner.start()
    recorder.start()
    events.on_publish.append(recorder.on_published)
    sampler.listeners.append(recorder.on_window)
    # not core: a store failure writing run records must not stop the agent's admissions
    supervisor.spawn("run-records-writer", recorder.writer(), core=False)
    if e.retrain_interval_s > 0:
        supervisor.spawn("estimator-retrain", learner.periodic(e.retrain_interval_s), core=False)
    every = f"every {e.retrain_interval_s:g} s" if e.retrain_interval_s > 0 else "on demand"
    log.info(
        "estimator: run records from progress reports (windows of %g s or more); retrains %s%s",
        e.progress_window_s,
        every,
        f"; the model in use was learned on this node: {learned}" if learned else "",
    )
    return NodeLearning(recorder, learner)
