"""Watches: the change log's events as each watcher sees them (its namespace and
selector), streamed as newline-delimited JSON from a ``resourceVersion``."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web

from tests.kubeworld.apiserver.errors import status_body
from tests.kubeworld.apiserver.objects import Kind, Obj
from tests.kubeworld.apiserver.params import flag, int_param
from tests.kubeworld.apiserver.reads import ASKER
from tests.kubeworld.apiserver.selection import Selector


@dataclass
class Change:
    version: int
    resource: str
    type: str
    obj: Obj
    old: Obj | None  # the state before (MODIFIED, DELETED)
    # the event as sent, by type: encoded once for every watcher that sees it so
    lines: dict[str, bytes] = field(default_factory=dict)


@dataclass(eq=False)  # hashed by identity: a set of them
class Watcher:
    kind: Kind
    namespace: str
    selector: Selector
    bookmarks: bool
    queue: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)  # lines
    client: str = ""  # whose token opened it (FakeApiServer.client_token), or ""


def event_for(watcher: Watcher, change: Change) -> Obj | None:
    """The change as this watcher sees it (its namespace, its selector), or None."""
    if change.resource != watcher.kind.resource:
        return None
    namespace = change.obj["metadata"].get("namespace", "")
    if watcher.namespace and namespace != watcher.namespace:
        return None
    now = watcher.selector.matches(change.obj)
    before = change.old is not None and watcher.selector.matches(change.old)
    if change.type == "MODIFIED" and now != before:
        kind = "ADDED" if now else "DELETED"
    elif change.type == "DELETED":
        kind = "DELETED" if now else ""
    else:
        kind = change.type if now else ""
    # change.obj is a copy of its own that nothing changes: the watchers share it
    return {"type": kind, "object": change.obj} if kind else None


def encoded(event: Obj) -> bytes:
    """One line of a watch stream."""
    return json.dumps(event).encode() + b"\n"


def watch_line(event: Obj, change: Change) -> bytes:
    """``event`` (of ``change``) as one line of a watch stream, encoded once."""
    kind = event["type"]
    if kind not in change.lines:
        change.lines[kind] = encoded(event)
    return change.lines[kind]


class Watching:
    """The part of :class:`FakeApiServer` that streams watches."""

    async def _watch(
        self, kind: Kind, namespace: str, selector: Selector, request: web.Request
    ) -> web.StreamResponse:
        q = request.query
        timeout_s = float(int_param(q.get("timeoutSeconds", "0"), "timeoutSeconds")) or 1800.0
        client = asker.client if (asker := ASKER.get()) is not None else ""
        watcher = Watcher(
            kind, namespace, selector, flag(q.get("allowWatchBookmarks")), client=client
        )
        version = q.get("resourceVersion", "")
        backlog: list[bytes] = []
        if version in ("", "0"):
            for obj in self._matching(kind, namespace, selector):
                backlog.append(encoded({"type": "ADDED", "object": obj}))
                if client:
                    self._count_line(client, kind.resource, obj, backlog[-1])
        elif (since := int_param(version, "resourceVersion")) < self.floor:
            message = f"too old resource version: {since} ({self.floor + 1})"
            backlog.append(
                encoded({"type": "ERROR", "object": status_body(410, "Expired", message)})
            )
            timeout_s = 0.0  # and the stream ends
        else:
            for change in (c for c in self.history if c.version > since):
                if (event := event_for(watcher, change)) is not None:
                    backlog.append(watch_line(event, change))
                    if client:
                        self._count_line(client, kind.resource, change.obj, backlog[-1])
        if timeout_s:
            self.watchers.add(watcher)  # before any await: no change falls between
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        # the stream's end, at its timeout: one timer, not one per event
        ending = asyncio.get_running_loop().call_later(timeout_s, watcher.queue.put_nowait, None)
        try:
            await response.prepare(request)
            if backlog:
                await response.write(b"".join(backlog))
            while True:
                lines = [await watcher.queue.get()]
                while lines[-1] is not None and not watcher.queue.empty():
                    lines.append(watcher.queue.get_nowait())  # what queued meanwhile: one write
                sent = [line for line in lines if line is not None]
                if sent:
                    await response.write(b"".join(sent))
                if lines[-1] is None:
                    break
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went
        finally:
            ending.cancel()
            self.watchers.discard(watcher)
        return response

    def bookmark(self) -> None:
        """Send a BOOKMARK (the current resourceVersion) to every watch that asked for them."""
        for watcher in self.watchers:
            if watcher.bookmarks:
                obj = {
                    "kind": watcher.kind.kind,
                    "apiVersion": watcher.kind.api_version,
                    "metadata": {"resourceVersion": str(self.version)},
                }
                line = encoded({"type": "BOOKMARK", "object": obj})
                watcher.queue.put_nowait(line)
                if watcher.client:
                    self._count_line(watcher.client, watcher.kind.resource, None, line)
