"""The store: objects by resource and (namespace, name) under one global, increasing
``resourceVersion``; a bounded history of changes (for watches and lists at a revision);
create, update and delete as the real server's registry does them, and the test helpers that
put objects in place."""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Iterable
from typing import Any

from tests.kubeworld.apiserver.core import PODS, default_pod
from tests.kubeworld.apiserver.errors import NAMESPACE_MISMATCH, ApiError, not_found
from tests.kubeworld.apiserver.kinds import KINDS
from tests.kubeworld.apiserver.objects import Key, Kind, Obj, copy_json, timestamp
from tests.kubeworld.apiserver.resource import RESOURCE_CLAIMS
from tests.kubeworld.apiserver.watch import Change, event_for, watch_line

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

_GENERATED_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the server's: no vowels, no 0, 1, 3
_GENERATED_PREFIX_MAX = 58  # 63 - 5: the server cuts a longer generateName


class Store(dict[str, dict[Key, Obj]]):
    """The stored objects: by resource, then by (namespace, name) (namespace "" for a
    cluster-scoped kind). Called with a resource (and a namespace), copies of its objects in
    (namespace, name) order: ``api.objects("resourceclaims")``."""

    def __call__(self, resource: str, namespace: str | None = None) -> list[Obj]:
        chosen = (
            (key, obj)
            for key, obj in self[resource].items()
            if namespace is None or key[0] == namespace
        )
        return [copy_json(obj) for _, obj in sorted(chosen, key=lambda pair: pair[0])]


class Storage:
    """The part of :class:`FakeApiServer` that keeps the objects (see the module's text)."""

    def _find(self, kind: Kind, namespace: str, name: str) -> Obj:
        found = self.objects[kind.resource].get((namespace if kind.namespaced else "", name))
        if found is None:
            raise not_found(kind.resource, name, kind.group)
        return found

    def _generated_name(self, kind: Kind, namespace: str, prefix: str) -> str:
        """``generateName`` + 5 characters of the server's alphabet, a name not taken."""
        while True:
            suffix = "".join(secrets.choice(_GENERATED_ALPHABET) for _ in range(5))
            name = prefix[:_GENERATED_PREFIX_MAX] + suffix
            if (namespace, name) not in self.objects[kind.resource]:
                return name

    def _commit(self, kind: Kind, change_type: str, obj: Obj, old: Obj | None = None) -> Obj:
        """Store one write under the next resourceVersion; send it to the watchers."""
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if change_type == "DELETED":
            self.objects[kind.resource].pop(key, None)
        else:
            self.objects[kind.resource][key] = obj
        if len(self.history) == self.history.maxlen:
            self.floor = self.history[0].version
        change = Change(self.version, kind.resource, change_type, copy_json(obj), old)
        self.history.append(change)
        if kind is RESOURCE_CLAIMS:
            self._note_allocation(change.obj)
        for watcher in self.watchers:
            if (event := event_for(watcher, change)) is not None:
                line = watch_line(event, change)
                watcher.queue.put_nowait(line)
                if watcher.client:
                    self._count_line(watcher.client, kind.resource, change.obj, line)
        return copy_json(obj)

    def _insert(self, kind: Kind, namespace: str, body: Any, *, keep_status: bool = False) -> Obj:
        """A create. The real server drops a new ResourceClaim's ``status``; with
        ``keep_status`` (a test's object put in place) it stays."""
        if not isinstance(body, dict):
            raise ApiError(400, f"the object provided is not a {kind.kind}")
        obj = copy_json(body)
        obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
        meta = obj.setdefault("metadata", {})
        if kind.namespaced and meta.setdefault("namespace", namespace) != namespace:
            raise ApiError(400, NAMESPACE_MISMATCH)
        if not kind.namespaced:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self._generated_name(kind, namespace, meta["generateName"])
        name = meta.get("name", "")
        if not name or not _NAME.match(name):
            why = "Required value: name or generateName is required" if not name else "Invalid"
            raise ApiError(422, f'{kind.kind} "{name}" is invalid: metadata.name: {why}')
        if kind.checked and self._unchecked:
            meta["generation"] = 1
        elif kind.checked:
            self._admit_new(kind, obj, keep_status)
        if (meta.get("namespace", ""), name) in self.objects[kind.resource]:
            details = {"name": name, **({"group": kind.group} if kind.group else {})}
            message = f'{kind.qualified} "{name}" already exists'
            raise ApiError(409, message, "AlreadyExists", {**details, "kind": kind.resource})
        if kind is PODS:
            if not (obj.get("spec") or {}).get("containers"):
                raise ApiError(422, f'Pod "{name}" is invalid: spec.containers: Required value')
            default_pod(obj)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=timestamp())
        meta.pop("deletionTimestamp", None)
        return self._commit(kind, "ADDED", obj)

    def _update(self, kind: Kind, stored: Obj, new: Obj) -> Obj:
        """Write ``new`` over ``stored`` (no-op writes are skipped); delete an object being
        deleted once its finalizers are gone. resource.k8s.io objects are checked first."""
        meta, old_meta = new["metadata"], stored["metadata"]
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if kind.checked:
            self._admit(kind, new, stored)
            changed = new.get("spec") != stored.get("spec")
            meta["generation"] = old_meta.get("generation", 1) + int(changed)
        if new == stored:
            return copy_json(stored)
        if old_meta.get("deletionTimestamp") and not (meta.get("finalizers") or []):
            return self._commit(kind, "DELETED", stored, copy_json(stored))
        return self._commit(kind, "MODIFIED", new, copy_json(stored))

    def _remove(self, kind: Kind, stored: Obj) -> Obj:
        """Delete ``stored`` now, or, while it has finalizers, mark it (``deletionTimestamp``)
        until a write empties them."""
        meta = stored["metadata"]
        if not meta.get("finalizers"):
            return self._commit(kind, "DELETED", stored, copy_json(stored))
        if meta.get("deletionTimestamp"):
            return copy_json(stored)
        new = copy_json(stored)
        new["metadata"].update(deletionTimestamp=timestamp(), deletionGracePeriodSeconds=0)
        return self._commit(kind, "MODIFIED", new, copy_json(stored))

    @property
    def resource_version(self) -> str:
        return str(self.version)

    def put_object(self, resource: str, obj: Obj) -> Obj:
        """Put ``obj`` in place as a controller would have before the test, ``status``
        included: created (ADDED), or written over the stored one of that name (MODIFIED;
        its uid kept). Checked as the server checks a write: raises :class:`ApiError` where
        it would refuse it. A namespaced object without a namespace goes to ``default``."""
        kind = KINDS[resource]
        meta = obj.get("metadata") or {}
        namespace = (meta.get("namespace") or "default") if kind.namespaced else ""
        stored = self.objects[resource].get((namespace, meta.get("name", "")))
        if stored is None:
            return self._insert(kind, namespace, obj, keep_status=True)
        new = {**copy_json(obj), "kind": kind.kind, "apiVersion": kind.api_version}
        new["metadata"] = {**new.get("metadata", {}), "namespace": namespace}
        if not kind.namespaced:
            new["metadata"].pop("namespace")
        return self._update(kind, stored, new)

    def put_objects(self, resource: str, objs: Iterable[Obj], *, check_each: bool = True) -> int:
        """Many objects put in place (as :meth:`put_object` puts each) as though they had
        stood there before every watch began: no watch is sent them one by one; instead
        the history is compacted and every watch ended, so that each client, resuming,
        gets 410 Expired and lists again. Returns how many were put. ``check_each``
        False: only the first is checked against the schemas (the others made alike)."""
        watchers, self.watchers = self.watchers, set()  # no await below: none opens meanwhile
        count = 0
        try:
            for obj in objs:
                self.put_object(resource, obj)
                count += 1
                self._unchecked = not check_each
        finally:
            self.watchers = watchers
            self._unchecked = False
        self.compact()
        self.end_watches()
        return count

    def delete_object(self, resource: str, namespace: str, name: str) -> Obj:
        """Delete as a DELETE without options does (a pod: with its grace period; any other
        object at once, or marked while it has finalizers)."""
        kind = KINDS[resource]
        if kind is PODS:
            return self._delete(namespace, name, None, {})
        return self._remove(kind, self._find(kind, namespace if kind.namespaced else "", name))

    def compact(self) -> None:
        """Forget the history, as etcd's compaction does: older watches get 410 Expired."""
        self.history.clear()
        self.floor = self.version

    def end_watches(self) -> None:
        """End every open watch stream, as the server does at ``timeoutSeconds``."""
        for watcher in list(self.watchers):
            watcher.queue.put_nowait(None)
