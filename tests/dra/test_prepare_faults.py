"""Prepare when the API answers badly: every outcome of the claim's read is that claim's
own error (never the whole call), nothing is prepared twice, and a later Prepare gives
the same lease and the same CDI device."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dra.test_end_to_end import claim_of, running
from tests.helpers import short_dir
from tests.kubeworld.cluster.dra import claim_pod, claim_template, dra_cluster, eventually

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


FAULTS = [
    ({"status": 500}, "500"),
    ({"status": 429, "reason": "TooManyRequests"}, "429"),
    ({"status": 0}, "Unreachable"),
    ({"hang": True}, "Unreachable"),
]


async def test_each_outcome_of_reading_a_claim_is_that_claims_error(root: Path) -> None:
    async with dra_cluster(root, nodes=1, settings={"dra.api_timeout_s": 1.0}) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("t", memory="4Gi"))
        await cluster.apply(claim_pod("a", "t"))
        await cluster.apply(claim_pod("b", "t"))
        await running(cluster, "a", "b")
        a, b = claim_of(cluster, "a"), claim_of(cluster, "b")
        first = await node.kubelet.prepare([a, b])
        leases = {x.lease_id for x in await node.leases()}
        for fault, said in FAULTS:
            times = 2 if fault.get("status") == 0 else 1  # aiohttp sends a GET again once
            cluster.api_server.fail_next(
                "GET", f"/resourceclaims/{a['metadata']['name']}$", times=times, **fault
            )
            answer = await node.kubelet.prepare([a, b])
            error = answer[a["metadata"]["uid"]]
            assert isinstance(error, str) and said in error, (fault, error)
            assert answer[b["metadata"]["uid"]] == first[b["metadata"]["uid"]]
        again = await node.kubelet.prepare([a])
        assert again[a["metadata"]["uid"]] == first[a["metadata"]["uid"]]
        assert {x.lease_id for x in await node.leases()} == leases  # nothing prepared twice


async def test_a_claim_gone_or_replaced_is_refused_by_name(root: Path) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("t", memory="4Gi"))
        await cluster.apply(claim_pod("a", "t"))
        await running(cluster, "a")
        a = claim_of(cluster, "a")
        replaced: dict[str, Any] = {**a, "metadata": {**a["metadata"], "uid": "other-uid"}}
        answer = await node.kubelet.prepare([replaced])
        assert "was replaced" in str(answer["other-uid"])
        cluster.api_server.delete_pod("default", "a", force=True)
        await eventually(
            lambda: (
                not [c for c in cluster.claims() if c["metadata"]["uid"] == a["metadata"]["uid"]]
            )
        )
        gone = await node.kubelet.prepare([a])
        assert "does not exist" in str(gone[a["metadata"]["uid"]])


async def test_a_claim_prepared_again_gets_a_new_lease_and_a_reallocated_share_replaces_its_old(
    root: Path,
) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("t", memory="4Gi"))
        await cluster.apply(claim_pod("a", "t"))
        await running(cluster, "a")
        a = claim_of(cluster, "a")
        [first] = await node.leases()
        # unprepared (its pod gone), then prepared again for the next pod on this node
        assert await node.kubelet.unprepare([a]) == {a["metadata"]["uid"]: ""}
        assert await node.leases() == []
        answer = await node.kubelet.prepare([a])
        assert not isinstance(answer[a["metadata"]["uid"]], str)
        [second] = await node.leases()
        assert second.lease_id != first.lease_id and second.request_id != first.request_id
        # deallocated and allocated here again: a new share; the reconcile ends the old
        moved = json.loads(json.dumps(a))
        result = moved["status"]["allocation"]["devices"]["results"][0]
        result["shareID"] = "5e0e2d4c-1111-4222-8333-444455556666"
        moved["status"].pop("devices", None)
        cluster.api_server.put_object("resourceclaims", {**a, "status": {}})  # deallocated
        cluster.api_server.put_object("resourceclaims", moved)
        answer = await node.kubelet.prepare([moved])
        assert not isinstance(answer[a["metadata"]["uid"]], str)

        async def only_the_new_share() -> bool:
            leases = await node.leases()
            return [x.request_id.split(":")[2] for x in leases] == [result["shareID"]]

        async with asyncio.timeout(30):
            while not await only_the_new_share():
                await asyncio.sleep(0.1)
        assert (node.cdi_dir / f"gpushare.io-claim_{a['metadata']['uid']}.json").exists()


async def test_a_prepare_the_kubelet_gave_up_on_ends_whole_and_is_answered_the_same(
    root: Path,
) -> None:
    """The kubelet's deadline cancels the call mid-way: the agent's work runs to its end
    (a lease admitted is in its claim's spec), and the kubelet's next Prepare gets that
    lease, not a second one."""
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("t", memory="4Gi"))
        await cluster.apply(claim_pod("a", "t"))
        await running(cluster, "a")
        a = claim_of(cluster, "a")
        uid = a["metadata"]["uid"]
        assert await node.kubelet.unprepare([a]) == {uid: ""}
        node.kubelet.call_timeout_s = 0.001  # gives up at once: the agent is cut off
        cut = await node.kubelet.prepare([a])
        assert isinstance(cut[uid], str)
        node.kubelet.call_timeout_s = 45.0
        spec = node.cdi_dir / f"gpushare.io-claim_{uid}.json"
        await asyncio.sleep(1.0)  # what reached the agent has run to its end meanwhile
        again = await node.kubelet.prepare([a])
        assert not isinstance(again[uid], str)
        [lease] = await node.leases()
        assert (
            json.loads(spec.read_text())["devices"][0]["containerEdits"]["env"].count(
                f"GPUSHARE_LEASE_ID={lease.lease_id}"
            )
            == 1
        )
