"""Faults and holds, each the way a real API server or the network fails a request: an
error status, a broken connection, no answer until the client's timeout, each of these
after the change was made (``landed``); and a request held until a test releases it."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from aiohttp import web

from tests.kubeworld.apiserver.errors import ApiError
from tests.kubeworld.apiserver.objects import Handler

HANG_S = 300.0  # the longest a hanging fault holds a request whose client stays


@dataclass
class Fault:
    """How the next matching requests are answered (see :meth:`FakeApiServer.fail_next`)."""

    method: str
    path: re.Pattern[str]
    status: int  # 0: the connection breaks instead of an answer
    reason: str
    message: str
    times: int
    landed: bool = False  # served first (its change made), then answered this way
    hang: bool = False  # no answer until the client gives up (or HANG_S), then a break


@dataclass
class Hold:
    """A request held before it is served: ``arrived`` is set when it comes, and it goes
    on once ``release`` is set (or is dropped with its connection if the client left)."""

    method: str
    path: re.Pattern[str]
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


class Faults:
    """The part of :class:`FakeApiServer` that fails and holds requests."""

    async def _faulted(
        self, fault: Fault, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """The request as ``fault`` says: served first if it landed (its answer dropped),
        then held if it hangs, then answered with the fault's status or a broken
        connection."""
        if fault.landed:
            await self._serve(request, handler)
        if fault.hang:  # until the client goes: its handler is cancelled then
            self.hanging += 1
            try:
                await asyncio.sleep(HANG_S)
            finally:
                self.hanging -= 1
        if fault.status == 0 or fault.hang:
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=500)  # never sent: the connection is gone
        return ApiError(fault.status, fault.message, fault.reason).response()

    def hold_next(self, method: str, path_regex: str) -> Hold:
        """Hold the next request whose method and path (with its query) match until the
        returned hold's ``release`` is set."""
        hold = Hold(method.upper(), re.compile(path_regex))
        self.holds.append(hold)
        return hold

    def fail_next(
        self,
        method: str,
        path_regex: str,
        status: int = 0,
        *,
        reason: str = "",
        message: str = "injected failure",
        times: int = 1,
        landed: bool = False,
        hang: bool = False,
    ) -> Fault:
        """Answer the next ``times`` requests whose method and path (with its query,
        searched) match with this status and a ``Status`` body; 0 breaks the connection
        (aiohttp clients send an idempotent request again, once, when a reused connection
        breaks: ``times=2`` makes such a GET fail).

        ``landed``: the request is served first, its change made (a write that landed),
        and only its answer is the fault's: a 5xx, a broken connection, or a hang.
        ``hang``: no answer at all; the request is held until the client gives up (its
        timeout) and closes the connection, or for :data:`HANG_S`, then the connection
        breaks (``status`` is not used). Without ``landed`` nothing was done."""
        fault = Fault(
            method.upper(),
            re.compile(path_regex),
            status,
            reason,
            message,
            times,
            landed=landed,
            hang=hang,
        )
        self.faults.append(fault)
        return fault
