"""The binding-answer controller with real agents (``gpushare serve --sim`` as the DRA
driver, ``AnswerClaim`` over their real gRPC API): no agent answers on its own, so a claim
waits while the controller is down and its pod runs once the controller is back; a
controller restarted after the agent admitted (its write not made) gets the same lease
from the agent and writes one answer; the controller's counters say what it did."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dra.test_end_to_end import claim_of, leases_by_pod, running
from tests.helpers import short_dir
from tests.kubeworld.cluster.dra import claim_pod, claim_template, dra_cluster, eventually

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


async def test_a_claim_waits_while_the_controller_is_down_and_runs_once_it_is_back(
    root: Path,
) -> None:
    async with dra_cluster(root, nodes=1, controller=False, binding_timeout_s=60) as cluster:
        await cluster.apply(claim_template("quarter-gpu", memory="20Gi", threads="25"))
        await cluster.apply(claim_pod("app", "quarter-gpu"))
        await eventually(
            lambda: any(c.get("status", {}).get("allocation") for c in cluster.claims())
        )
        await asyncio.sleep(2.0)  # nobody answers: the agent follows no claims
        claim = claim_of(cluster, "app")
        assert not claim["status"].get("devices")
        assert ("default", "app") not in cluster.running.containers
        assert not await leases_by_pod(cluster)

        controller = cluster.start_controller()
        await running(cluster, "app")
        claim = claim_of(cluster, "app")
        [answer] = claim["status"]["devices"]
        assert answer["conditions"][0]["type"] == "gpushare.io/admitted"
        lease = (await leases_by_pod(cluster))["default/app"]
        assert lease.lease_id in answer["conditions"][0]["message"]
        counters = controller.counters
        assert counters.answers_written == 1 and counters.asks >= 1
        assert counters.claims_seen >= 1 and counters.bytes_decoded > 0


async def test_a_controller_restarted_mid_answer_writes_the_agents_same_lease_once(
    root: Path,
) -> None:
    async with dra_cluster(root, nodes=1, controller=False, binding_timeout_s=60) as cluster:
        api = cluster.api_server
        await cluster.apply(claim_template("quarter-gpu", memory="20Gi", threads="25"))
        await cluster.apply(claim_pod("app", "quarter-gpu"))
        await eventually(
            lambda: any(c.get("status", {}).get("allocation") for c in cluster.claims())
        )
        hold = api.hold_next("PUT", r"/resourceclaims/app-gpu-[^/]+/status")  # the answer's
        cluster.start_controller()
        await asyncio.wait_for(hold.arrived.wait(), 60)  # the agent admitted; the write held
        [node] = cluster.nodes.values()
        [before] = (await node.lease_ids())[claim_of(cluster, "app")["metadata"]["uid"]]
        await cluster.stop_controller()  # killed with its write in flight (never sent on)
        hold.release.set()
        controller = cluster.start_controller()  # a new term lists the claims again
        await running(cluster, "app")
        after = (await leases_by_pod(cluster))["default/app"]
        assert after.lease_id == before  # the agent answered the same lease
        [answer] = claim_of(cluster, "app")["status"]["devices"]
        assert before in answer["conditions"][0]["message"]
        assert controller.counters.answers_written <= 1
