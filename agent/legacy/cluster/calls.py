"""The binder's calls to the agents, and the work it does not let its caller cut short.

An agent's refusal is a :class:`BindError` in the agent's words. A call whose agent link
closed under it (the agent left the cache) is a failed call like any other, never taken for
the bind's own cancellation (grpc.aio raises ``CancelledError`` then). :func:`unbroken`
runs a piece of work to its end whatever happens to the task that waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import grpc

from agent.core.lease import ENDED_REQUEST_ID_HINT
from agent.legacy.cluster.agents import AgentLink
from agent.legacy.cluster.bounded import printable
from agent.legacy.cluster.cache import AgentCache

log = logging.getLogger(__name__)

T = TypeVar("T")


class BindError(Exception):
    """Why a pod was not bound (the sentence the scheduler shows)."""


async def unbroken(work: Coroutine[Any, Any, T]) -> T:
    """``work`` run to its end even if the caller is cancelled meanwhile; the
    cancellation is raised once it has ended."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # seen: the cancellation is what the caller gets
        raise asyncio.CancelledError
    return task.result()


@contextlib.contextmanager
def link_closed_fails(node: str) -> Iterator[None]:
    """A call whose agent link closed under it raises ``CancelledError`` in grpc.aio
    (``UsageError`` when it closed before the call): unless this task is the one being
    cancelled, it is a failed call (UNAVAILABLE). The cache closes a link when its agent
    moves (a new address) or refuses its token."""
    try:
        yield
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        raise _unavailable(
            f"the connection to the agent on {node} closed during the call"
        ) from None
    except grpc.aio.UsageError as exc:
        raise _unavailable(f"the connection to the agent on {node} is closed: {exc}") from None


def _unavailable(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None
    )


def link_of(cache: AgentCache, node: str) -> AgentLink:
    """The link to ``node``'s agent; :class:`BindError` saying why there is none."""
    link = cache.link(node)
    if link is None:
        raise BindError(f"{node}: {cache.why_unknown(node)}")
    return link


async def agent_call(node: str, call: Awaitable[T]) -> T:
    """The call's answer; a refusal, or a failure to answer, is a :class:`BindError`."""
    try:
        with link_closed_fails(node):
            return await call
    except grpc.aio.AioRpcError as exc:
        raise BindError(refused_by(node, exc)) from exc


async def give_back(
    cache: AgentCache, node: str, lease_id: str, undo: Callable[[], Awaitable[Any]]
) -> bool:
    """Give a lease back (``undo``: its Release); whether it is not live any more. One
    that ended before (FAILED_PRECONDITION, NOT_FOUND) counts as given back; one that the
    agent does not take back is logged and still live for all this side knows: the
    controller's reconcile ends it."""
    cache.drop_pending(node, lease_id)
    try:
        with link_closed_fails(node):
            await undo()
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
            return True
        log.warning(
            "lease %s on %s not given back: %s", lease_id, node, printable(exc.details() or "")
        )
        return False
    return True


def refused_by(node: str, exc: grpc.aio.AioRpcError) -> str:
    return f"{node}: the agent refused: {exc.code().name}: {exc.details()}"


def ended_request_id(exc: grpc.aio.AioRpcError) -> bool:
    """The agent's answer to a request id whose lease has ended (never reused)."""
    return exc.code() is grpc.StatusCode.FAILED_PRECONDITION and ENDED_REQUEST_ID_HINT in (
        exc.details() or ""
    )
