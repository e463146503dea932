"""The API stand-in behind the DRA role, on a thread of its own (the doctor and the agent are
processes the tests wait on): the node, the RuntimeClasses, and an RBAC stand-in that
grants the ClusterRole of deploy/dra/rbac.yaml, as the chart renders it, to the agent's
service-account token."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import yaml
from aiohttp import web

from tests.e2e.threaded_api import ServerThread
from tests.helpers import REPO
from tests.kubeworld.apiserver import ApiError, FakeApiServer

NODE = "worker-1"
USER = "system:serviceaccount:gpushare-system:gpushare-agent"


def service_account_token() -> str:
    """A token shaped as a service account's (a JWT naming its user); unsigned."""

    def part(value: dict[str, str]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part({'sub': USER})}.x"


TOKEN = service_account_token()


@dataclass
class Role:
    """The ClusterRole bound to the agent's service account: (groups, resources, verbs)."""

    rules: list[tuple[frozenset[str], frozenset[str], frozenset[str]]]

    @classmethod
    def shipped(cls) -> Role:
        """deploy/dra/rbac.yaml's ClusterRole, as the chart renders it."""
        docs = yaml.safe_load_all((REPO / "deploy" / "dra" / "rbac.yaml").read_text())
        (role,) = [d for d in docs if d and d["kind"] == "ClusterRole"]
        return cls(
            [
                (frozenset(r["apiGroups"]), frozenset(r["resources"]), frozenset(r["verbs"]))
                for r in role["rules"]
            ]
        )

    def allows(self, group: str, resource: str, verb: str) -> bool:
        return any(group in g and resource in r and verb in v for g, r, v in self.rules)

    def granting(self, group: str, resource: str, verb: str) -> Role:
        rule = (frozenset({group}), frozenset({resource}), frozenset({verb}))
        return Role([*self.rules, rule])

    def without(self, group: str, resource: str) -> Role:
        return Role([(g, r - {resource} if group in g else r, v) for g, r, v in self.rules])


def attributes(request: web.Request) -> tuple[str, str, str, str]:
    """(API group, resource, verb, name) of a request, as the API server authorizes it."""
    parts = request.path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else ""
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if request.method in verbs:
        return group, resource, verbs[request.method], name
    if request.method == "DELETE":
        return group, resource, "delete" if name else "deletecollection", name
    watch = request.query.get("watch") in ("1", "true")
    return group, resource, "get" if name else "watch" if watch else "list", name


@dataclass
class Cluster:
    """The API stand-in, served while :meth:`running`: the node, the RuntimeClasses, and
    the role its token is granted."""

    role: Role = field(default_factory=Role.shipped)
    runtime_classes: set[str] = field(default_factory=lambda: {"nvidia"})
    url: str = ""

    @contextmanager
    def running(self) -> Iterator[Cluster]:
        with ServerThread(self._served, name="api-stand-in"):
            yield self

    @contextmanager
    def granted(self, role: Role) -> Iterator[None]:
        shipped, self.role = self.role, role
        try:
            yield
        finally:
            self.role = shipped

    @asynccontextmanager
    async def _served(self) -> AsyncIterator[None]:
        api = FakeApiServer(token=TOKEN)
        api.app.middlewares.append(self._authorize)
        api.app.router.add_get("/apis/node.k8s.io/v1/runtimeclasses/{name}", self._runtime_class)
        async with api:
            api.create_node(NODE, labels={"nvidia.com/gpu.present": "true"})
            self.url = api.url
            yield

    @web.middleware
    async def _authorize(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        group, resource, verb, name = attributes(request)
        if self.role.allows(group, resource, verb):
            response: web.StreamResponse = await handler(request)
            return response
        qualified = f"{resource}.{group}" if group else resource
        message = (
            f'{qualified} "{name}" is forbidden: User "{USER}" cannot {verb} resource '
            f'"{resource}" in API group "{group}" at the cluster scope'
        )
        return ApiError(403, message, "Forbidden").response()

    async def _runtime_class(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.runtime_classes:
            message = f'runtimeclasses.node.k8s.io "{name}" not found'
            return ApiError(404, message, "NotFound").response()
        return web.json_response(
            {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "nvidia"}
        )
