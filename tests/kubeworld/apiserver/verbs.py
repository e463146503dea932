"""The REST verbs every kind shares: list (pages, a revision), get, create, PUT, PATCH,
DELETE of one object or a collection; and the query parameters they read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web

from tests.kubeworld.apiserver.core import PODS, check_pod_update
from tests.kubeworld.apiserver.errors import MODIFIED_WHY, NAMESPACE_MISMATCH, ApiError, conflict
from tests.kubeworld.apiserver.objects import Key, Kind, Obj, copy_json
from tests.kubeworld.apiserver.paging import (
    EXPIRED_CONTINUE,
    decode_continue,
    encode_continue,
    list_key,
)
from tests.kubeworld.apiserver.params import delete_options, flag, int_param, read_json, selector_of
from tests.kubeworld.apiserver.patch import apply_patch
from tests.kubeworld.apiserver.reads import ASKER
from tests.kubeworld.apiserver.resource import RESOURCE_CLAIMS
from tests.kubeworld.apiserver.selection import Selector


def check_preconditions(kind: Kind, stored: Obj, preconditions: Mapping[str, Any]) -> None:
    """A 409 for a ``uid`` or ``resourceVersion`` precondition ``stored`` does not meet."""
    meta = stored["metadata"]
    for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = preconditions.get(key)
        if wanted and wanted != meta.get(key):
            why = (
                f"Precondition failed: {label} in precondition: {wanted}, "
                f"{label} in object meta: {meta.get(key)}"
            )
            raise conflict(kind.qualified, meta["name"], why)


def with_subresource(kind: Kind, stored: Obj, written: Obj, subresource: str) -> Obj:
    """What a write to the main resource (``written`` but the stored status) or to
    ``/status`` (the stored object but ``written``'s status) stores."""
    if subresource == "status":
        new = {**copy_json(stored), "status": written.get("status") or {}}
    else:
        new = {**written, "status": copy_json(stored.get("status") or {})}
        if "status" not in stored:
            new.pop("status")
    new["kind"], new["apiVersion"] = kind.kind, kind.api_version
    return new


class Verbs:
    """The part of :class:`FakeApiServer` that answers the REST verbs."""

    async def _list(self, kind: Kind, request: web.Request) -> web.StreamResponse:
        q = request.query
        namespace = request.match_info.get("namespace", "")
        selector = selector_of(kind, q)
        if flag(q.get("watch")):
            return await self._watch(kind, namespace, selector, request)
        limit = int_param(q.get("limit") or "0", "limit")
        start, revision = self._list_start(q, limit)
        chosen = sorted(
            (list_key(key, namespace), obj)
            for key, obj in self._state_at(kind, revision, start).items()
            if (not namespace or key[0] == namespace) and selector.matches(obj)
        )
        after = [(key, obj) for key, obj in chosen if key >= start] if start else chosen
        page = after[:limit] if limit > 0 else after
        # serialized before anything can change them: no copies needed
        listing = self._list_of(kind, (obj for _, obj in page), revision or self.version)
        if len(page) < len(after):  # more: the next page from just after this one's last key
            meta = listing["metadata"]
            meta["continue"] = encode_continue(page[-1][0] + "\x00", revision or self.version)
            if selector == Selector():  # unknown with a selector, as on the real server
                meta["remainingItemCount"] = len(after) - len(page)
        if kind is RESOURCE_CLAIMS and (asker := ASKER.get()) is not None:
            for item in listing["items"]:
                self._count_claim(asker.client, item, self._claim_size(item))
            asker.counted = True
        return web.json_response(listing)

    def _list_start(self, q: Mapping[str, str], limit: int) -> tuple[str, int]:
        """(the key a list starts at, "" for the first; the revision it reads, 0 for the
        current state), from its ``continue``, ``resourceVersion`` and
        ``resourceVersionMatch``, as the real server's storage reads them."""
        version = q.get("resourceVersion", "")
        if token := q.get("continue", ""):
            start, revision = decode_continue(token)
            if version not in ("", "0"):
                raise ApiError(
                    400, "specifying resource version is not allowed when using continue"
                )
            return start, max(revision, 0)  # -1: an inconsistent token, the latest state
        if version in ("", "0"):
            return "", 0
        wanted = int_param(version, "resourceVersion")
        if wanted > self.version:
            raise ApiError(504, f"Too large resource version: {wanted}, current: {self.version}")
        match = q.get("resourceVersionMatch", "")
        if match == "Exact" or (match == "" and limit > 0):  # the legacy paged case: exact
            return "", wanted
        return "", 0  # NotOlderThan: the current state is not older

    def _state_at(self, kind: Kind, revision: int, start: str = "") -> dict[Key, Obj]:
        """The objects of ``kind`` as they were at ``revision`` (0 or the current one: as
        they are), rebuilt from the history; 410 Expired when it was compacted away (a
        continue token's: with a token that goes on from ``start`` in the latest state)."""
        stored = self.objects[kind.resource]
        if not revision or revision == self.version:
            return stored
        if revision < self.floor:
            if start:
                token = encode_continue(start, -1)
                raise ApiError(410, EXPIRED_CONTINUE, meta={"continue": token})
            raise ApiError(410, f"too old resource version: {revision} ({self.floor + 1})")
        state = dict(stored)
        for change in reversed(self.history):
            if change.version <= revision:
                break
            if change.resource != kind.resource:
                continue
            key = (change.obj["metadata"].get("namespace", ""), change.obj["metadata"]["name"])
            if change.type == "ADDED":
                state.pop(key, None)
            elif change.old is not None:
                state[key] = change.old
        return state

    def _matching(self, kind: Kind, namespace: str, selector: Selector) -> list[Obj]:
        """The stored objects in ``namespace`` (all: "") that ``selector`` selects, in
        (namespace, name) order."""
        return [
            obj
            for (ns, _), obj in sorted(self.objects[kind.resource].items())
            if (not namespace or ns == namespace) and selector.matches(obj)
        ]

    def _list_of(self, kind: Kind, objects: Iterable[Obj], version: int = 0) -> Obj:
        """A ``<Kind>List`` (its items have no kind/apiVersion) at ``version`` (0: the
        current one)."""
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(version or self.version)},
            "items": [
                {k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in objects
            ],
        }

    async def _get(self, kind: Kind, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        return web.json_response(self._find(kind, m.get("namespace", ""), m["name"]))

    async def _create(self, kind: Kind, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        return web.json_response(
            self._insert(kind, request.match_info.get("namespace", ""), body), status=201
        )

    async def _replace(
        self, kind: Kind, subresource: str, request: web.Request
    ) -> web.StreamResponse:
        """PUT: the whole object; a ``metadata.resourceVersion`` other than the stored one
        is a 409 (none: an unconditional update, as these kinds allow). The main resource
        keeps the stored ``status``; ``/status`` takes only ``status``."""
        m = request.match_info
        name, namespace = m["name"], m.get("namespace", "")
        body = await read_json(request)
        stored = self._find(kind, namespace, name)
        meta = body.get("metadata") if isinstance(body, dict) else None
        if not isinstance(meta, dict):
            raise ApiError(422, f'{kind.kind} "{name}" is invalid: metadata: Required value')
        if meta.get("name") != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        if kind.namespaced and meta.get("namespace", namespace) != namespace:
            raise ApiError(400, NAMESPACE_MISMATCH)
        version = meta.get("resourceVersion")
        if version and version != stored["metadata"]["resourceVersion"]:
            raise conflict(kind.qualified, name, MODIFIED_WHY)
        check_preconditions(kind, stored, {"uid": meta.get("uid")})
        new = copy_json(body)
        if kind.namespaced:
            new["metadata"]["namespace"] = namespace
        else:
            new["metadata"].pop("namespace", None)
        new = with_subresource(kind, stored, new, subresource)
        return web.json_response(self._update(kind, stored, new))

    async def _patch(
        self, kind: Kind, subresource: str, request: web.Request
    ) -> web.StreamResponse:
        m = request.match_info
        body = await read_json(request)
        return web.json_response(
            self._patch_object(
                kind, m.get("namespace", ""), m["name"], request.content_type, body, subresource
            )
        )

    def _patch_object(
        self, kind: Kind, namespace: str, name: str, content_type: str, patch: Any, sub: str
    ) -> Obj:
        stored = self._find(kind, namespace, name)
        patched = apply_patch(content_type, copy_json(stored), patch)
        meta = patched.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(422, f'{kind.kind} "{name}" is invalid: metadata: Required value')
        version = meta.get("resourceVersion")
        if version and version != stored["metadata"]["resourceVersion"]:
            raise conflict(kind.qualified, name, MODIFIED_WHY)
        for key in ("name", "namespace"):
            if meta.get(key, "") != stored["metadata"].get(key, ""):
                raise ApiError(400, f"the {key} of the object does not match the {key} on the URL")
        if meta.get("uid", stored["metadata"]["uid"]) != stored["metadata"]["uid"]:
            raise ApiError(
                422, f'{kind.kind} "{name}" is invalid: metadata.uid: field is immutable'
            )
        new = with_subresource(kind, stored, patched, sub)
        if kind is PODS:
            check_pod_update(stored, new)
        return self._update(kind, stored, new)

    async def _delete_object(self, kind: Kind, request: web.Request) -> web.StreamResponse:
        """DELETE of one object (not a pod): ``preconditions`` (uid, resourceVersion) in the
        DeleteOptions body are 409s when they do not match."""
        m = request.match_info
        options = await delete_options(request)
        stored = self._find(kind, m.get("namespace", ""), m["name"])
        check_preconditions(kind, stored, options.get("preconditions") or {})
        return web.json_response(self._remove(kind, stored))

    async def _delete_collection(self, kind: Kind, request: web.Request) -> web.StreamResponse:
        """DELETE on a list path (what the kubelet does to a node's ResourceSlices): every
        selected object; the answer lists them as deleted (or marked, with finalizers)."""
        await delete_options(request)
        selector = selector_of(kind, request.query)
        chosen = self._matching(kind, request.match_info.get("namespace", ""), selector)
        return web.json_response(self._list_of(kind, [self._remove(kind, o) for o in chosen]))
