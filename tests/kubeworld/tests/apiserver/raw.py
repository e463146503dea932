"""A bare HTTP client of the API stand-in (as kubectl or client-go would drive it), the
Status body it checks, and the pod its tests create."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

NS = "team-a"
PODS = f"/api/v1/namespaces/{NS}/pods"
FINALIZER = "gpushare.io/lease"


class Raw:
    """A bare HTTP client of the stand-in: (status, decoded JSON body)."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(
            method, self.url + path, data=data, headers=headers, params=params
        ) as response:
            return response.status, await response.json(content_type=None)

    async def watch(self, path: str, **params: str) -> list[dict[str, Any]]:
        """Every event of one watch until the server ends it."""
        query = {"watch": "1", **params}
        async with self.session.get(self.url + path, params=query) as response:
            assert response.status == 200
            return [json.loads(line) async for line in response.content if line.strip()]


def assert_status(body: Any, code: int, reason: str) -> None:
    assert body["kind"] == "Status" and body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert (body["code"], body["reason"]) == (code, reason)
    assert body["message"]


def manifest(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **extra},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }


def binding(name: str, node: str, uid: str = "") -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, **({"uid": uid} if uid else {})}
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"kind": "Node", "name": node},
    }
