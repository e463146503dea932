"""The running agent's effective configuration, for ``gpushare config show``: written at
start beside the socket (``<socket>.config.json``, mode 0600: settings, never secrets,
which live in files the settings only name), read back only while the agent that wrote it
still holds the socket's instance lock."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import Any

import psutil
import yaml

from agent.config import Settings, load_settings
from agent.config.loading import settings_as_dict

log = logging.getLogger(__name__)
CLOCK_SLACK_S = 1.0  # process start times are read in clock ticks


def record_path(socket_path: str) -> str:
    return f"{socket_path}.config.json"


def publish(settings: Settings) -> None:
    """Log the settings and write the record atomically (a reader never sees half of it)."""
    values = settings_as_dict(settings)
    log.info("effective configuration: %s", values)
    path = record_path(settings.unix_socket_path)
    record = {"pid": os.getpid(), "started_at": time.time(), "settings": values}
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(record, out)
    os.replace(temporary, path)


def last(socket_path: str) -> dict[str, Any] | None:
    """The record of the last agent started on ``socket_path``, running or not."""
    with contextlib.suppress(OSError, ValueError):
        with open(record_path(socket_path)) as f:
            record = json.load(f)
        if isinstance(record, dict) and isinstance(record.get("settings"), dict):
            return record
    return None


def settings_of(record: dict[str, Any]) -> Settings:
    """The settings a record holds, as the agent resolved them (no environment, no file)."""
    text = yaml.safe_dump(record["settings"], sort_keys=False)
    return load_settings(text, env={}, overrides={}, source="the agent's published settings")


def running(socket_path: str) -> dict[str, Any] | None:
    """The record of the agent that holds ``socket_path`` now, else None (no agent, or a
    record left by one that is gone). It never touches the lock itself: a probe could make
    an agent starting at that moment believe another one runs."""
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
        record = last(socket_path)
        if record is None:
            return None
        with open(f"{socket_path}.lock") as f:
            holder = int(f.read().split()[0])
        if holder == record["pid"] and _same_process(holder, float(record["started_at"])):
            return record
    return None


def _same_process(pid: int, published_at: float) -> bool:
    """Is ``pid`` alive and the process that published at ``published_at`` (a process that
    began later reuses the number)?"""
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and (
            process.create_time() <= published_at + CLOCK_SLACK_S
        )
    except psutil.Error:
        return False
