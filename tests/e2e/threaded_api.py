"""An asyncio server on a thread of its own, for tests whose other side blocks: a process
the test waits on (the doctor, an agent), or plain blocking HTTP clients.

``serving`` is an async context manager factory: what it sets up is served from the
moment it is entered until :meth:`ServerThread.stop`, then it is exited on the same loop.
A failure to set up is raised by :meth:`ServerThread.start`; one while serving or
tearing down, by :meth:`ServerThread.stop`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


class ServerThread:
    def __init__(
        self, serving: Callable[[], AbstractAsyncContextManager[Any]], *, name: str
    ) -> None:
        self._serving = serving
        self.name = name
        self.thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    def start(self) -> None:
        """Serve; returns once set up (or raises what the set-up raised)."""
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()
        assert self._ready.wait(START_TIMEOUT_S), f"{self.name} did not start"
        assert self._failure is None, self._failure

    def stop(self) -> None:
        """Stop serving and tear down; raises what serving or tearing down raised."""
        assert self._loop is not None and self._stop is not None and self.thread is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(STOP_TIMEOUT_S)
        assert not self.thread.is_alive(), f"{self.name} did not stop"
        assert self._failure is None, self._failure

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start() or stop()
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with self._serving():
            self._ready.set()
            await self._stop.wait()
