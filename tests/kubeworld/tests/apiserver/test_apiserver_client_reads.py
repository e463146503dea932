"""The API stand-in counts, per client (a token of its own), the bytes of ResourceClaims it
sent that client, split by whether the claim's allocation names (or named) that client's
node: in a list, a watch, a GET; and ``put_objects`` stands many claims in at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.kubeworld.apiserver import FakeApiServer

Obj = dict[str, Any]
NS = "team-a"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"


def claim(name: str, node: str | None) -> Obj:
    """A claim allocated to ``node`` (one share of its gpu-0), or not allocated (None)."""
    body: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
        "status": {},
    }
    if node is not None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        result = {
            "request": "gpu",
            "driver": "gpushare.io",
            "pool": node,
            "device": "gpu-0",
            "shareID": "8d0c4d9e-6c4e-4f38-9a53-3c1f0f6b1f11",
        }
        body["status"] = {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {"nodeSelectorTerms": [term]},
            }
        }
    return body


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token="t") as server:
        server.put_object("resourceclaims", claim("on-a", "node-a"))
        server.put_object("resourceclaims", claim("on-b", "node-b"))
        server.put_object("resourceclaims", claim("nowhere", None))
        yield server


async def _get(api: FakeApiServer, token: str, path: str) -> bytes:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.get(api.url + path) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.read()


def _size(item: Obj) -> int:
    return len(json.dumps(item).encode())


async def test_a_list_counts_each_claim_for_whose_node_it_is(api: FakeApiServer) -> None:
    token = api.client_token("node-a")
    assert token == "t-node-a"
    listing = json.loads(await _get(api, token, CLAIMS))
    sizes = {i["metadata"]["name"]: _size(i) for i in listing["items"]}
    assert api.claim_bytes_read("node-a") == (
        sizes["on-a"],
        sizes["on-b"] + sizes["nowhere"],
    )
    assert api.claim_bytes_read("node-b") == (0, 0)  # it asked nothing
    assert api.client_reads("node-a").requests == 1
    await _get(api, "t", CLAIMS)  # the shared token: nobody's
    assert api.claim_bytes_read("node-a") == (sizes["on-a"], sizes["on-b"] + sizes["nowhere"])


async def test_a_get_counts_foreign_only_for_another_nodes_claim(api: FakeApiServer) -> None:
    token = api.client_token("node-b")
    mine = await _get(api, token, f"{CLAIMS}/on-b")
    assert api.claim_bytes_read("node-b") == (len(mine), 0)
    other = await _get(api, token, f"{CLAIMS}/on-a")
    assert api.claim_bytes_read("node-b") == (len(mine), len(other))
    # a claim once allocated here stays its own once deallocated
    api.put_object("resourceclaims", claim("on-b", None))
    again = await _get(api, token, f"{CLAIMS}/on-b")
    assert api.claim_bytes_read("node-b") == (len(mine) + len(again), len(other))


async def test_a_watch_counts_each_event_for_whose_node_its_claim_is(
    api: FakeApiServer,
) -> None:
    token = api.client_token("node-a")
    headers = {"Authorization": f"Bearer {token}"}
    version = api.resource_version
    params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "5"}
    lines: list[bytes] = []
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.get(api.url + CLAIMS, params=params) as response,
    ):
        await asyncio.sleep(0.1)  # the watch is open
        changed_b = claim("on-b", "node-b")
        changed_b["metadata"]["labels"] = {"x": "1"}
        api.put_object("resourceclaims", changed_b)
        changed_a = claim("on-a", "node-a")
        changed_a["metadata"]["labels"] = {"x": "1"}
        api.put_object("resourceclaims", changed_a)
        while len(lines) < 2:
            lines.append(await response.content.readline())
    events = [json.loads(line) for line in lines]
    assert [e["object"]["metadata"]["name"] for e in events] == ["on-b", "on-a"]
    assert api.claim_bytes_read("node-a") == (len(lines[1]), len(lines[0]))
    reads = api.client_reads("node-a")
    assert reads.watch_claim_bytes == reads.watch_bytes == len(lines[0]) + len(lines[1])


async def test_put_objects_stands_claims_in_and_ends_the_watches(api: FakeApiServer) -> None:
    before = api.resource_version
    put = api.put_objects("resourceclaims", (claim(f"other-{i}", f"far-{i}") for i in range(50)))
    assert put == 50
    assert len(api.objects("resourceclaims", NS)) == 53
    assert api.floor == api.version > int(before)  # a watch from before must list again
