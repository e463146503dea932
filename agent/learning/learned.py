"""Where the models learned on this node, and the retrain history, live on disk.

- ``<state_dir>/estimator/learned/<UTC time>-<hex>/``: a learned model, written into a
  ``.staging-*`` folder, its files and the folder synced, then renamed into place, so a
  crash never leaves half a model under a model's name;
- ``learned/active``: the name of the one in use, replaced atomically; at start it replaces
  ``estimator.model_dir`` in the gate (one that does not load is set aside, and logged);
- the newest ``MODELS_KEPT`` are kept (the active one always), and no staging folder;
- ``<state_dir>/estimator/history.json``: the newest ``HISTORY_KEPT`` retrain attempts.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.core.errors import ValidationError
from agent.estimator.model import RetentionModel
from agent.learning.gate import ProfileGate

if TYPE_CHECKING:
    from agent.estimator.learning import Retrained

log = logging.getLogger(__name__)
HISTORY_KEPT = 200
MODELS_KEPT = 3
ACTIVE = "active"


def learned_root(state_dir: str) -> Path:
    return Path(state_dir) / "estimator" / "learned"


def history_path(state_dir: str) -> Path:
    return Path(state_dir) / "estimator" / "history.json"


def active_learned(state_dir: str) -> Path | None:
    """The folder of the model learned on this node and in use, else None."""
    root = learned_root(state_dir)
    try:
        name = (root / ACTIVE).read_text().strip()
    except FileNotFoundError:
        return None
    return root / name if name else None


def adopt_learned(gate: ProfileGate, state_dir: str) -> Path | None:
    """At start: the model learned on this node, if any, replaces the configured one in
    the gate. Its folder (None: none, or one that does not load)."""
    found = load_learned(state_dir)
    if found is None:
        return None
    gate.use_model(found[0])
    return found[1]


def load_learned(state_dir: str) -> tuple[RetentionModel, Path] | None:
    """The active learned model (None without one; a model that does not load is logged
    and left aside: the configured one is used)."""
    try:
        path = active_learned(state_dir)
        return (RetentionModel.load(path), path) if path is not None else None
    except (OSError, ValidationError) as exc:
        log.warning("the model learned on this node does not load (%s): using the configured", exc)
        return None


def install(
    outcome: Retrained,
    state_dir: str,
    *,
    history: list[dict[str, Any]],
    clock: Callable[[], float],
) -> tuple[RetentionModel, Path]:
    """Save a swapped-in model into a staging folder, sync it, rename it into place, load
    it back and name it active (blocking: run it on a thread)."""
    from agent.estimator.learning import save_learned

    root = learned_root(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(clock()))}-{secrets.token_hex(3)}"
    staging, final = root / f".staging-{name}", root / name
    save_learned(outcome, staging, history=history)
    for written in staging.iterdir():  # on disk before the rename makes it a model
        _sync_file(written)
    _sync_dir(staging)
    os.rename(staging, final)
    _sync_dir(root)
    model = RetentionModel.load(final)
    _write_atomically(root / ACTIVE, final.name)
    prune(root, keep=final)
    return model, final


def prune(root: Path, *, keep: Path) -> None:
    """Leave the newest MODELS_KEPT learned models (the active one always), and no staging
    folder a crash left."""
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    for old in [p for p in folders[:-MODELS_KEPT] if p != keep]:
        shutil.rmtree(old, ignore_errors=True)
    for staging in root.glob(".staging-*"):
        shutil.rmtree(staging, ignore_errors=True)


def read_history(state_dir: str) -> list[dict[str, Any]]:
    """The attempts kept; a history that does not read is logged and started again."""
    try:
        found = json.loads(history_path(state_dir).read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("the retrain history does not read (%s): starting a new one", exc)
        return []
    return [x for x in found if isinstance(x, dict)] if isinstance(found, list) else []


def write_history(state_dir: str, history: list[dict[str, Any]]) -> None:
    path = history_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, json.dumps(history[-HISTORY_KEPT:], indent=1))


def _write_atomically(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    with open(staging, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(staging, path)
    _sync_dir(path.parent)


def _sync_file(path: Path) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
