"""The stand-in API server pages its lists as the real one does (``limit`` and
``continue``, from the API conventions): pages in storage-key order, an opaque continue
token, ``remainingItemCount`` without selectors, one resourceVersion and one consistent
snapshot for every page of a list whatever changes meanwhile, ``410 Expired`` (with a token
for the rest in the latest state) for a token whose version was compacted away, 400 for a
token it did not make. And the REST adapter asks for pages and reads them back."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from agent.kubeapi.port import Gone
from agent.kubeapi.rest import RestKubeApi
from tests.kubeworld.apiserver import EXPIRED_CONTINUE, FakeApiServer
from tests.kubeworld.tests.apiserver.raw import Raw, assert_status

CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
TOKEN = "paging-token"


def claim(name: str, namespace: str = "ns", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
    }


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=TOKEN) as server:
        yield server


@pytest.fixture
async def raw(api: FakeApiServer) -> AsyncIterator[Raw]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        yield Raw(session, api.url)


def names(body: dict[str, Any]) -> list[str]:
    return [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in body["items"]]


async def pages(raw: Raw, path: str = CLAIMS, **params: str) -> list[dict[str, Any]]:
    """Every page of one list, following ``metadata.continue``."""
    found: list[dict[str, Any]] = []
    query = dict(params)
    while True:
        status, body = await raw.call("GET", path, params=query)
        assert status == 200, body
        found.append(body)
        token = body["metadata"].get("continue")
        if not token:
            return found
        query = {**params, "continue": token}


def put(api: FakeApiServer, count: int) -> list[str]:
    """``count`` claims across two namespaces; their keys in storage order."""
    made = [claim(f"c-{i:05d}", "ns" if i % 2 else "ns-b") for i in range(count)]
    api.put_objects("resourceclaims", made, check_each=False)
    return sorted(f"{c['metadata']['namespace']}/{c['metadata']['name']}" for c in made)


async def test_a_list_with_a_limit_comes_in_pages_of_one_version(
    api: FakeApiServer, raw: Raw
) -> None:
    keys = put(api, 1200)
    listed = await pages(raw, limit="500")
    assert [len(p["items"]) for p in listed] == [500, 500, 200]
    assert [p["metadata"].get("remainingItemCount") for p in listed] == [700, 200, None]
    assert [bool(p["metadata"].get("continue")) for p in listed] == [True, True, False]
    assert {p["metadata"]["resourceVersion"] for p in listed} == {api.resource_version}
    assert [key for p in listed for key in names(p)] == keys  # each once, in key order
    assert all("kind" not in item for p in listed for item in p["items"])


async def test_without_a_limit_one_page_holds_everything(api: FakeApiServer, raw: Raw) -> None:
    keys = put(api, 30)
    [page] = await pages(raw)
    assert names(page) == keys and "continue" not in page["metadata"]
    [page] = await pages(raw, limit="30")  # exactly the limit: no next page
    assert names(page) == keys and "continue" not in page["metadata"]


async def test_the_pages_of_one_list_are_one_snapshot_whatever_changes_meanwhile(
    api: FakeApiServer, raw: Raw
) -> None:
    keys = put(api, 10)
    status, first = await raw.call("GET", CLAIMS, params={"limit": "4"})
    assert status == 200
    version = first["metadata"]["resourceVersion"]
    api.delete_object("resourceclaims", "ns-b", "c-00008")  # on a later page
    api.put_object("resourceclaims", claim("c-00009", labels="changed"))  # on a later page
    api.put_object("resourceclaims", claim("c-99999"))  # made after the snapshot
    rest: list[dict[str, Any]] = []
    token = first["metadata"]["continue"]
    while token:
        status, body = await raw.call("GET", CLAIMS, params={"limit": "4", "continue": token})
        assert status == 200
        rest.append(body)
        token = body["metadata"].get("continue")
    assert names(first) + [k for p in rest for k in names(p)] == keys  # as it was
    assert {p["metadata"]["resourceVersion"] for p in rest} == {version}
    changed = [i for p in rest for i in p["items"] if i["metadata"]["name"] == "c-00009"]
    assert changed[0]["metadata"]["labels"] == {}  # the old copy
    [now] = await pages(raw)
    assert "ns/c-99999" in names(now) and "ns-b/c-00008" not in names(now)


def decoded(token: str) -> dict[str, Any]:
    return json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))


async def test_the_continue_token_is_the_real_servers(api: FakeApiServer, raw: Raw) -> None:
    put(api, 5)
    status, body = await raw.call("GET", CLAIMS, params={"limit": "2"})
    assert status == 200
    token = body["metadata"]["continue"]
    assert "=" not in token
    assert decoded(token) == {
        "v": "meta.k8s.io/v1",
        "rv": int(body["metadata"]["resourceVersion"]),
        "start": names(body)[-1] + "\x00",  # just after the last key sent
    }
    status, body = await raw.call(
        "GET", "/apis/resource.k8s.io/v1/namespaces/ns-b/resourceclaims", params={"limit": "2"}
    )
    assert status == 200
    assert decoded(body["metadata"]["continue"])["start"] == "c-00002\x00"  # below ns-b/


async def test_a_token_whose_version_was_compacted_is_410_with_a_token_for_the_rest(
    api: FakeApiServer, raw: Raw
) -> None:
    keys = put(api, 6)
    status, first = await raw.call("GET", CLAIMS, params={"limit": "2"})
    assert status == 200
    api.put_object("resourceclaims", claim("c-99999"))
    api.compact()
    token = first["metadata"]["continue"]
    status, body = await raw.call("GET", CLAIMS, params={"limit": "2", "continue": token})
    assert status == 410
    assert_status(body, 410, "Expired")
    assert body["message"] == EXPIRED_CONTINUE
    inconsistent = body["metadata"]["continue"]
    assert decoded(inconsistent)["rv"] == -1
    rest = await pages(raw, limit="2", **{"continue": inconsistent})
    assert names(first) + [k for p in rest for k in names(p)] == [*keys, "ns/c-99999"]
    assert {p["metadata"]["resourceVersion"] for p in rest} == {api.resource_version}


@pytest.mark.parametrize(
    "token",
    [
        "not base64!",
        base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v2","rv":3,"start":"a"}').decode(),
        base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":0,"start":"a"}').decode(),
        base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":3,"start":""}').decode(),
        base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":3,"start":"../x"}').decode(),
    ],
)
async def test_a_token_the_server_did_not_make_is_a_400(
    api: FakeApiServer, raw: Raw, token: str
) -> None:
    put(api, 3)
    status, body = await raw.call("GET", CLAIMS, params={"limit": "1", "continue": token})
    assert status == 400
    assert_status(body, 400, "BadRequest")
    assert body["message"].startswith("invalid continue token")


async def test_a_token_with_a_resource_version_is_a_400(api: FakeApiServer, raw: Raw) -> None:
    put(api, 3)
    status, body = await raw.call("GET", CLAIMS, params={"limit": "1"})
    token = body["metadata"]["continue"]
    params = {
        "limit": "1",
        "continue": token,
        "resourceVersion": body["metadata"]["resourceVersion"],
    }
    status, body = await raw.call("GET", CLAIMS, params=params)
    assert status == 400
    assert body["message"] == "specifying resource version is not allowed when using continue"


async def test_pages_with_a_selector_say_no_remaining_count(api: FakeApiServer, raw: Raw) -> None:
    api.put_objects(
        "resourceclaims",
        [claim(f"c-{i}", team="a" if i % 3 else "b") for i in range(9)],
        check_each=False,
    )
    listed = await pages(raw, limit="2", labelSelector="team=a")
    assert [len(p["items"]) for p in listed] == [2, 2, 2]
    assert all("remainingItemCount" not in p["metadata"] for p in listed)
    assert all(i["metadata"]["labels"] == {"team": "a"} for p in listed for i in p["items"])


async def test_an_exact_or_paged_list_of_an_old_version_reads_that_version(
    api: FakeApiServer, raw: Raw
) -> None:
    api.put_object("resourceclaims", claim("a"))
    old = api.resource_version
    api.put_object("resourceclaims", claim("b"))
    for params in (
        {"resourceVersion": old, "resourceVersionMatch": "Exact"},
        {"resourceVersion": old, "limit": "5"},  # the legacy rule: exact when paged
    ):
        status, body = await raw.call("GET", CLAIMS, params=params)
        assert status == 200
        assert names(body) == ["ns/a"] and body["metadata"]["resourceVersion"] == old
    status, body = await raw.call("GET", CLAIMS, params={"resourceVersion": old})
    assert status == 200 and len(body["items"]) == 2  # not older than: the current state
    api.compact()
    params = {"resourceVersion": old, "resourceVersionMatch": "Exact"}
    status, body = await raw.call("GET", CLAIMS, params=params)
    assert status == 410
    assert_status(body, 410, "Expired")


# -- the REST adapter -----------------------------------------------------------------------


async def test_the_adapter_asks_for_pages_and_reads_their_tokens(api: FakeApiServer) -> None:
    keys = put(api, 7)
    async with RestKubeApi.from_url(api.url, token=TOKEN) as kube:
        first = await kube.list_resource_claims(limit=3)
        assert len(first.items) == 3 and first.remaining_items == 4 and first.continue_token
        second = await kube.list_resource_claims(limit=3, continue_token=first.continue_token)
        third = await kube.list_resource_claims(limit=3, continue_token=second.continue_token)
        assert third.continue_token == "" and third.remaining_items is None
        listed = [*first.items, *second.items, *third.items]
        assert [f"{c['metadata']['namespace']}/{c['metadata']['name']}" for c in listed] == keys
        assert first.resource_version == second.resource_version == third.resource_version
        whole = await kube.list_resource_claims()  # no limit: one answer, no token
        assert len(whole.items) == 7 and whole.continue_token == ""
        assert len((await kube.list_resource_claims(namespace="ns", limit=2)).items) == 2
        api.compact()
        api.put_object("resourceclaims", claim("c-99999"))
        api.compact()
        with pytest.raises(Gone):
            await kube.list_resource_claims(limit=3, continue_token=first.continue_token)
    assert any("limit=3" in path and "continue=" in path for _, path, _ in api.log)
