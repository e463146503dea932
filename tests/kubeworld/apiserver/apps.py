"""apps/v1: DaemonSets (get, list, delete: a test puts them in place, ``status`` included,
as their controller would have written them; DeleteOptions are recorded)."""

from __future__ import annotations

from functools import partial

from aiohttp import web

from tests.kubeworld.apiserver.objects import META_FIELDS, META_REFUSAL, Kind, copy_json
from tests.kubeworld.apiserver.params import delete_options
from tests.kubeworld.apiserver.verbs import check_preconditions

# apps/v1 DaemonSets: get, list and delete only; a test puts them in place, status
# included (put_object), as their controller would have written them.
DAEMON_SETS = Kind("daemonsets", "DaemonSet", "apps/v1", True, META_FIELDS, META_REFUSAL)


class AppsV1:
    """The apps/v1 part of :class:`FakeApiServer`."""

    def _apps_routes(self) -> None:
        add = self.app.router.add_route
        daemon_sets = "/apis/apps/v1/namespaces/{namespace}/daemonsets"
        add("GET", daemon_sets, partial(self._list, DAEMON_SETS))
        add("GET", daemon_sets + "/{name}", partial(self._get, DAEMON_SETS))
        add("DELETE", daemon_sets + "/{name}", self._delete_daemon_set)

    async def _delete_daemon_set(self, request: web.Request) -> web.StreamResponse:
        """DELETE of a DaemonSet, its DeleteOptions recorded. ``propagationPolicy``
        Foreground leaves it marked with the finalizer ``foregroundDeletion`` (no garbage
        collector here removes it); Background, Orphan or none delete it at once."""
        m = request.match_info
        options = await delete_options(request)
        self.deletions.append((request.path, options))
        stored = self._find(DAEMON_SETS, m["namespace"], m["name"])
        check_preconditions(DAEMON_SETS, stored, options.get("preconditions") or {})
        policy = options.get("propagationPolicy") or request.query.get("propagationPolicy")
        if policy == "Foreground" and not stored["metadata"].get("deletionTimestamp"):
            stored = copy_json(stored)
            stored["metadata"]["finalizers"] = ["foregroundDeletion"]
        return web.json_response(self._remove(DAEMON_SETS, stored))
