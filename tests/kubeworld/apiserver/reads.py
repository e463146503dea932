"""What the server sent each client (a token of its own): the bytes of ResourceClaims, by
whether the claim's allocation names that client's node, requests, watch bytes."""

from __future__ import annotations

import contextvars
import json
from dataclasses import dataclass

from aiohttp import web

from tests.kubeworld.apiserver.objects import Obj
from tests.kubeworld.apiserver.resource import RESOURCE_CLAIMS


@dataclass
class Asker:
    client: str  # whose token the request came with (see FakeApiServer.client_token)
    counted: bool = False  # the claims of its answer were counted already


ASKER: contextvars.ContextVar[Asker | None] = contextvars.ContextVar(
    "fake_apiserver_asker", default=None
)


@dataclass
class ClientReads:
    """What the API server sent one client (every connection made with its token):
    ``own`` / ``foreign``: bytes of ResourceClaims (list items, single objects, watch
    events) whose allocation named (ever, or now) that client's node, or not (unallocated
    claims, other nodes' claims); ``requests``: every request it made; ``watch_bytes``:
    every watch event line sent to it, of any kind (bookmarks included)."""

    own: int = 0
    foreign: int = 0
    requests: int = 0
    watch_bytes: int = 0
    watch_claim_bytes: int = 0  # of own + foreign, those that came in watch events


def allocation_nodes(claim: Obj) -> set[str]:
    """The nodes a claim's allocation names (``nodeSelector`` matchFields on
    ``metadata.name`` with ``In``); none for an unallocated claim."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    return {
        value
        for term in terms
        for match in term.get("matchFields") or []
        if match.get("key") == "metadata.name" and match.get("operator") == "In"
        for value in match.get("values") or []
    }


class ClientCounting:
    """The part of :class:`FakeApiServer` that counts what each client was sent."""

    def client_token(self, client: str) -> str:
        """A bearer token of its own for ``client`` (``<token>-<client>``), accepted from
        now on; what is sent on it is counted for ``client``."""
        token = f"{self.token or 'token'}-{client}"
        self.tokens[token] = client
        return token

    def client_reads(self, client: str) -> ClientReads:
        return self.reads.setdefault(client, ClientReads())

    def claim_bytes_read(self, client: str) -> tuple[int, int]:
        """(own, foreign): bytes of ResourceClaims sent to ``client`` (see :class:`ClientReads`)."""
        reads = self.reads.get(client) or ClientReads()
        return reads.own, reads.foreign

    def _count_claim(self, client: str, claim: Obj, size: int, *, watched: bool = False) -> None:
        reads = self.client_reads(client)
        nodes = self._claim_nodes.get(str(claim.get("metadata", {}).get("uid")), set())
        if client in nodes or client in allocation_nodes(claim):
            reads.own += size
        else:
            reads.foreign += size
        if watched:
            reads.watch_claim_bytes += size

    def _count_line(self, client: str, resource: str, obj: Obj | None, line: bytes) -> None:
        """A watch event line sent to ``client``."""
        self.client_reads(client).watch_bytes += len(line)
        if resource == RESOURCE_CLAIMS.resource and obj is not None and "spec" in obj:
            self._count_claim(client, obj, len(line), watched=True)

    def _claim_size(self, item: Obj) -> int:
        """The bytes of one claim as a list item (encoded once per resourceVersion)."""
        meta = item.get("metadata") or {}
        uid, version = str(meta.get("uid")), str(meta.get("resourceVersion"))
        cached = self._claim_sizes.get(uid)
        if cached is None or cached[0] != version:
            cached = (version, len(json.dumps(item).encode()))
            self._claim_sizes[uid] = cached
        return cached[1]

    def _count_answer(
        self, client: str, request: web.Request, response: web.StreamResponse
    ) -> None:
        """The claims in a (non-watch) answer to ``client``: one object, or a list's items."""
        if (
            "/resourceclaims" not in request.path
            or not isinstance(response, web.Response)
            or response.status >= 300
            or not isinstance(response.body, bytes)
        ):
            return
        body = json.loads(response.body)
        if not isinstance(body, dict):
            return
        if isinstance(body.get("items"), list):
            for item in body["items"]:
                self._count_claim(client, item, self._claim_size(item))
        elif "spec" in body:
            self._count_claim(client, body, len(response.body))

    def _note_allocation(self, claim: Obj) -> None:
        if nodes := allocation_nodes(claim):
            uid = str(claim["metadata"].get("uid"))
            self._claim_nodes.setdefault(uid, set()).update(nodes)
