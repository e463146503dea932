"""The claim reconcile works from the node (issue 37): the claims it reads are those of the
node's live leases and kept specs, one GET each by the name the node's claim index keeps,
never a list of the cluster's claims. Leases of the previous release (no index entry) are
found through their pod, else through one list of their namespace's claims.

The agent runs in this event loop as the node's DRA driver (its reconcile's passes made by
the test, one at a time), against the API stand-in, whose request log is what is counted.
The index surviving a kill -9 of a real agent process is in the last test."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.claims.driver import ClaimDriver
from agent.claims.reconcile import Reconciler
from agent.dra.port import ClaimRef
from agent.runtime.app import App
from tests.dra.fixtures import NODE
from tests.dra.test_claim_answers import allocated_claim, result
from tests.dra.test_end_to_end import running
from tests.helpers import fake_ports, running_app, sim_settings
from tests.kubeworld.apiserver import FakeApiServer
from tests.kubeworld.cluster.dra import claim_pod, claim_template, dra_cluster, eventually

pytestmark = pytest.mark.timeout(120)
CLAIMS = "/apis/resource.k8s.io/v1"


@pytest.fixture
async def app(root: Path, driver_settings: dict[str, object]) -> AsyncIterator[App]:
    settings = sim_settings(
        root,
        **{
            "estimator.model_dir": "none",
            **driver_settings,
            "dra.binding_conditions": False,  # no answers: the claims' reads are the reconcile's
            "dra.reconcile_interval_s": 3600,  # its passes are the test's
        },
    )
    async with running_app(settings, fake_ports(2)) as running_agent:
        yield running_agent


def parts(app: App) -> tuple[ClaimDriver, Reconciler]:
    assert app.dra is not None
    return app.dra.driver, app.dra.reconciler


def claim_reads(api: FakeApiServer, since: int) -> list[tuple[str, str]]:
    """(method, path) of the requests about claims and pods since ``since``."""
    return [
        (method, path)
        for method, path, _ in api.log[since:]
        if "/resourceclaims" in path or "/pods" in path
    ]


def claim_path(claim: dict[str, Any]) -> str:
    meta = claim["metadata"]
    return f"{CLAIMS}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"


async def prepared(
    api: FakeApiServer, driver: ClaimDriver, claim: dict[str, Any]
) -> dict[str, Any]:
    """The claim stored, then prepared here as the kubelet asks; the claim as stored."""
    stored = api.put_object("resourceclaims", claim)
    meta = stored["metadata"]
    answer = await driver.prepare([ClaimRef(meta["namespace"], meta["name"], meta["uid"])])
    assert not answer[meta["uid"]].error, answer
    return stored


def uid_of(claim: dict[str, Any]) -> str:
    return str(claim["metadata"]["uid"])


def claim_uids(driver: ClaimDriver) -> set[str]:
    return {x.request_id.split(":")[1] for x in driver.live_leases()}


def moved_elsewhere(api: FakeApiServer, claim: dict[str, Any]) -> None:
    """Deallocated, then allocated to another node (the allocation is immutable: two writes)."""
    api.put_object("resourceclaims", {**claim, "status": {}})
    other = allocated_claim("other-node", [result("other-node")])
    api.put_object("resourceclaims", {**claim, "status": other["status"]})


async def a_pass(reconciler: Reconciler) -> None:
    await asyncio.sleep(0.02)  # the leases are older than the pass
    await reconciler.once()


async def test_a_pass_reads_the_nodes_claims_only_and_releases_what_is_gone(
    app: App, api: FakeApiServer
) -> None:
    driver, reconciler = parts(app)
    for _ in range(20):  # the cluster's other claims: never read
        api.put_object("resourceclaims", allocated_claim("other-node", [result("other-node")]))
    live, gone, moved = [
        await prepared(api, driver, allocated_claim(NODE, [result(NODE, f"gpu-{i % 2}")]))
        for i in range(3)
    ]
    assert claim_uids(driver) == {uid_of(live), uid_of(gone), uid_of(moved)}
    index = driver.specs.index
    assert index.uids() == {uid_of(live), uid_of(gone), uid_of(moved)}

    since = len(api.log)
    await a_pass(reconciler)  # all three allocated here: nothing goes, three reads
    assert sorted(claim_reads(api, since)) == sorted(
        ("GET", claim_path(c)) for c in (live, gone, moved)
    )
    assert claim_uids(driver) == {uid_of(live), uid_of(gone), uid_of(moved)}

    api.delete_object("resourceclaims", "default", gone["metadata"]["name"])
    moved_elsewhere(api, moved)
    since = len(api.log)
    await a_pass(reconciler)
    assert sorted(claim_reads(api, since)) == sorted(
        ("GET", claim_path(c)) for c in (live, gone, moved)
    )
    assert claim_uids(driver) == {uid_of(live)}
    assert reconciler.released == 2
    assert driver.specs.claims() == {uid_of(live)}
    assert index.uids() == {uid_of(live)}

    since = len(api.log)
    await a_pass(reconciler)  # the node's claims only, whatever the cluster holds
    assert claim_reads(api, since) == [("GET", claim_path(live))]


@pytest.mark.parametrize("status", [500, 503, 0])
async def test_a_read_that_fails_keeps_the_lease_for_the_next_pass(
    app: App, api: FakeApiServer, status: int
) -> None:
    driver, reconciler = parts(app)
    claim = await prepared(api, driver, allocated_claim(NODE, [result(NODE)]))
    api.delete_object("resourceclaims", "default", claim["metadata"]["name"])
    path = claim_path(claim).replace(".", r"\.") + "$"
    # a broken connection is tried again once by the client: it breaks twice
    api.fail_next("GET", path, status, times=2 if status == 0 else 1)
    await a_pass(reconciler)
    assert claim_uids(driver) == {uid_of(claim)}
    assert driver.specs.claims() == {uid_of(claim)}
    assert driver.specs.index.uids() == {uid_of(claim)}
    await a_pass(reconciler)  # read now: gone
    assert claim_uids(driver) == set()
    assert driver.specs.claims() == set() and driver.specs.index.uids() == set()


def owned_by(claim: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """The claim as the resourceclaim controller makes it from the pod's template."""
    owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod["metadata"]["name"],
        "uid": pod["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    claim["metadata"]["ownerReferences"] = [owner]
    return claim


def pod_using(api: FakeApiServer, name: str, claim_name: str) -> dict[str, Any]:
    pod = claim_pod(name, "t")
    pod["spec"]["nodeName"] = NODE
    api.put_object("pods", pod)
    statuses = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name}]}
    return api.patch_pod("default", name, {"status": statuses}, subresource="status")


async def test_a_lease_of_the_previous_release_is_found_through_its_pod(
    app: App, api: FakeApiServer
) -> None:
    driver, reconciler = parts(app)
    claims = []
    for name in ("p-live", "p-gone"):
        claim = allocated_claim(NODE, [result(NODE)], name=f"{name}-gpu-abcde")
        pod = pod_using(api, name, claim["metadata"]["name"])
        claims.append(await prepared(api, driver, owned_by(claim, pod)))
    live, gone = claims
    assert {x.pod for x in driver.live_leases()} == {"default/p-live", "default/p-gone"}
    for claim in claims:  # made by the previous release: no index entry
        assert driver.specs.index.forget(uid_of(claim))
    api.delete_object("resourceclaims", "default", gone["metadata"]["name"])

    since = len(api.log)
    await a_pass(reconciler)
    reads = claim_reads(api, since)
    assert sorted(reads) == sorted(
        [
            ("GET", "/api/v1/namespaces/default/pods/p-live"),
            ("GET", claim_path(live)),
            ("GET", "/api/v1/namespaces/default/pods/p-gone"),
            ("GET", claim_path(gone)),  # 404: not the pod's claim any more
            ("GET", f"{CLAIMS}/namespaces/default/resourceclaims"),  # proves it gone
        ]
    ), reads
    assert claim_uids(driver) == {uid_of(live)}
    assert driver.specs.index.uids() == {uid_of(live)}  # by name from now on
    since = len(api.log)
    await a_pass(reconciler)
    assert claim_reads(api, since) == [("GET", claim_path(live))]


async def test_without_its_pod_the_namespaces_claims_are_listed_once(
    app: App, api: FakeApiServer
) -> None:
    driver, reconciler = parts(app)
    claims = []
    for name in ("a", "b", "c"):
        claim = allocated_claim(NODE, [result(NODE)], name=f"{name}-gpu-abcde")
        pod = pod_using(api, name, claim["metadata"]["name"])
        claims.append(await prepared(api, driver, owned_by(claim, pod)))
    for name in ("a", "b", "c"):
        api.delete_object("pods", "default", name)  # gone (no finalizers: at once)
    for claim in claims:
        driver.specs.index.forget(uid_of(claim))
    kept, gone, other = claims
    api.delete_object("resourceclaims", "default", gone["metadata"]["name"])

    since = len(api.log)
    await a_pass(reconciler)
    reads = claim_reads(api, since)
    listed = ("GET", f"{CLAIMS}/namespaces/default/resourceclaims")
    assert reads.count(listed) == 1, reads  # one list for the namespace's three leases
    assert not [p for _, p in reads if p.startswith(f"{CLAIMS}/resourceclaims")]  # no cluster list
    assert claim_uids(driver) == {uid_of(kept), uid_of(other)}
    assert driver.specs.index.uids() == {uid_of(kept), uid_of(other)}
    since = len(api.log)
    await a_pass(reconciler)
    assert sorted(claim_reads(api, since)) == sorted(("GET", claim_path(c)) for c in (kept, other))


async def test_an_entry_of_a_claim_that_admitted_nothing_is_swept(
    app: App, api: FakeApiServer
) -> None:
    """The binding answer keeps a claim's name before admitting; refused, it holds no
    lease and no spec: its entry goes at the next pass, not before one began after it."""
    driver, reconciler = parts(app)
    driver.remember_claim("4d7a1f52-0000-4000-8000-00000000abcd", "default", "refused-gpu-x")
    assert driver.specs.index.uids() == {"4d7a1f52-0000-4000-8000-00000000abcd"}
    since = len(api.log)
    await a_pass(reconciler)
    assert driver.specs.index.uids() == set()
    assert claim_reads(api, since) == []


async def test_the_index_survives_a_kill_and_the_reconcile_finds_the_claims_by_it(
    root: Path,
) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("t", memory="4Gi"))
        for name in ("a", "b"):
            await cluster.apply(claim_pod(name, "t"))
        await running(cluster, "a", "b")
        uids = {name: cluster.claim_uid(name) for name in ("a", "b")}
        index_dir = node.root / "state" / "cdi" / "claims"
        entries = {p.stem: json.loads(p.read_text()) for p in index_dir.glob("*.json")}
        assert set(entries) == set(uids.values())
        claim_a = next(c for c in cluster.claims() if c["metadata"]["uid"] == uids["a"])
        assert entries[uids["a"]]["name"] == claim_a["metadata"]["name"]

        assert node.process is not None
        os.kill(node.process.pid, signal.SIGKILL)
        await asyncio.to_thread(node.process.wait)
        since = len(cluster.api_server.log)
        node.start()
        await node.wait_ready()
        # the claim deleted behind the kubelet's back (its pod runs on): only the
        # reconcile can end its lease, and it reads it by its name from the index
        cluster.api_server.delete_object("resourceclaims", "default", claim_a["metadata"]["name"])

        async def released() -> bool:
            return uids["a"] not in await node.lease_ids()

        async with asyncio.timeout(30):
            while not await released():
                await asyncio.sleep(0.1)
        assert uids["b"] in await node.lease_ids()
        await eventually(lambda: not node.spec_file(uids["a"]).exists())
        assert {p.stem for p in index_dir.glob("*.json")} == {uids["b"]}
        reads = [p for m, p, _ in cluster.api_server.log[since:] if m == "GET"]
        assert f"{CLAIMS}/namespaces/default/resourceclaims/{claim_a['metadata']['name']}" in [
            p.split("?")[0] for p in reads
        ]
        assert not [p for p in reads if p.split("?")[0].endswith("/namespaces/default/pods/a")]
        assert not [
            p for p in reads if p.split("?")[0] == f"{CLAIMS}/namespaces/default/resourceclaims"
        ]
