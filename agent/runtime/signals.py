"""The agent's signal handlers: SIGTERM and SIGINT stop it, SIGHUP reloads its secrets."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install(*, stop: Callable[[int], None], reload: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop, signum)
    loop.add_signal_handler(signal.SIGHUP, reload)


def remove() -> None:
    loop = asyncio.get_running_loop()
    for signum in (*STOP_SIGNALS, signal.SIGHUP):
        loop.remove_signal_handler(signum)
