"""Every claim answered for what it is, on the loopback cluster with real agents: one share
per request (a pod of several containers runs), ``adminAccess`` gets the device without a
share, a claim with nothing of this driver on this node is an error, and what a claim
asks (consumed capacity, configuration) is checked before anything is admitted, so no
refused claim leaves a lease behind."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.dra.test_end_to_end import running
from tests.kubeworld.cluster.dra import DRIVER, DraCluster, DraNode, dra_cluster

pytestmark = pytest.mark.timeout(240)


def allocated_claim(
    node: str,
    results: list[dict[str, Any]],
    *,
    config: list[dict[str, Any]] | None = None,
    name: str = "",
) -> dict[str, Any]:
    """A claim as the scheduler leaves it once allocated (made by hand: another scheduler,
    or someone with write access to claims' status)."""
    uid = str(uuid.uuid4())
    allocation: dict[str, Any] = {
        "devices": {"results": results, "config": config or []},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name or f"hand-{uid[:8]}", "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": allocation},
    }


def result(
    pool: str, device: str = "gpu-0", request: str = "gpu", **consumed: str
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "request": request,
        "driver": DRIVER,
        "pool": pool,
        "device": device,
        "shareID": str(uuid.uuid4()),
    }
    if consumed:
        out["consumedCapacity"] = consumed
    return out


async def prepare(cluster: DraCluster, node: DraNode, claim: dict[str, Any]) -> Any:
    stored = cluster.api_server.put_object("resourceclaims", claim)
    claim["metadata"]["uid"] = stored["metadata"]["uid"]
    answer = await node.kubelet.prepare([stored])
    return answer[stored["metadata"]["uid"]]


BAD_SHARES = [
    ({"threads": "150"}, "threads"),
    ({"threads": "-50"}, "threads"),
    ({"threads": "0"}, "threads"),
    ({"memory": "512Ki"}, "memory"),
    ({"memory": "0"}, "memory"),
]


async def test_a_share_mps_cannot_express_is_refused_before_it_is_admitted(root: Path) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        for consumed, field in BAD_SHARES:
            claim = allocated_claim(node.name, [result(node.name, **consumed)])
            answer = await prepare(cluster, node, claim)
            assert isinstance(answer, str) and field in answer, (consumed, answer)
            assert await node.leases() == [], consumed  # nothing admitted, nothing leaked
        # the device's thread budget (200 %) is whole: 100 + 100 fit, 50 more does not
        for threads, fits in (("100", True), ("100", True), ("50", False)):
            claim = allocated_claim(node.name, [result(node.name, threads=threads)])
            answer = await prepare(cluster, node, claim)
            assert isinstance(answer, str) != fits, (threads, answer)
        assert sum(x.thread_pct for x in await node.leases()) == 200


BAD_CONFIGS = [
    {"profile": "llm\x00serve"},
    {"profile": "llm\nserve"},
    {"profile": "\x1b[31mred"},
    {"profile": "p" * 5000},
    {"retentionFloor": 2},
    {"priority": "platinum"},
]


async def test_a_claims_configuration_is_checked_as_admit_checks_it(root: Path) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        for parameters in BAD_CONFIGS:
            opaque = {
                "driver": DRIVER,
                "parameters": {"apiVersion": "gpushare.io/v1", "kind": "ShareConfig", **parameters},
            }
            claim = allocated_claim(
                node.name, [result(node.name)], config=[{"source": "FromClaim", "opaque": opaque}]
            )
            answer = await prepare(cluster, node, claim)
            assert isinstance(answer, str), parameters
            assert "\x00" not in answer and "\n" not in answer and "\x1b" not in answer
            assert len(answer) < 1024, parameters
            assert await node.leases() == [], parameters
        assert "p" * 200 not in node.log_text()


async def test_a_claim_with_nothing_of_this_driver_on_this_node_is_an_error(root: Path) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        elsewhere = allocated_claim("other-node", [result("other-node")])
        answer = await prepare(cluster, node, elsewhere)
        assert isinstance(answer, str) and "no gpushare.io device" in answer
        assert await node.leases() == []


async def test_admin_access_gets_the_device_and_no_share(root: Path) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        admin = result(node.name)
        admin["adminAccess"] = True
        del admin["shareID"]
        claim = allocated_claim(node.name, [admin])
        answer = await prepare(cluster, node, claim)
        assert not isinstance(answer, str), answer
        [device] = answer
        assert device.device_name == "gpu-0" and device.cdi_device_ids
        assert await node.leases() == []  # no share: nothing of the ledger's is taken
        spec_file = node.cdi_dir / f"gpushare.io-claim_{claim['metadata']['uid']}.json"
        [cdi] = json.loads(spec_file.read_text())["devices"]
        env = cdi["containerEdits"]["env"]
        assert any(e.startswith("NVIDIA_VISIBLE_DEVICES=GPU-") for e in env)
        assert not any(e.startswith("CUDA_MPS_") for e in env)  # not an MPS client
        assert await node.kubelet.unprepare([claim]) == {claim["metadata"]["uid"]: ""}
        assert not spec_file.exists()


def two_container_pod(name: str) -> dict[str, Any]:
    """Two containers that each ask ``gpushare.io/gpu: 1`` (the extended-resource
    mapping: one claim, a request per container)."""
    containers = [
        {"name": c, "image": "app", "resources": {"limits": {"gpushare.io/gpu": "1"}}}
        for c in ("train", "sidecar")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"securityContext": {"runAsUser": 1000}, "containers": containers},
    }


async def test_two_containers_each_with_a_share_run(root: Path) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(two_container_pod("duo"))
        await running(cluster, "duo")
        leases = await node.leases()
        assert len(leases) == 2
        train = cluster.running.env("default", "duo", "train")
        sidecar = cluster.running.env("default", "duo", "sidecar")
        ids = {train["GPUSHARE_LEASE_ID"], sidecar["GPUSHARE_LEASE_ID"]}
        assert ids == {x.lease_id for x in leases}


async def test_one_request_with_two_devices_on_this_node_is_refused_with_its_reason(
    root: Path,
) -> None:
    """One container with shares on two GPUs cannot reach both MPS servers (one pipe
    directory a process): refused until MPS can serve it."""
    async with dra_cluster(root, nodes=1) as cluster:  # the simulated node's 4 GPUs
        [node] = cluster.nodes.values()
        claim = allocated_claim(node.name, [result(node.name, "gpu-0"), result(node.name, "gpu-1")])
        answer = await prepare(cluster, node, claim)
        assert isinstance(answer, str) and "ONE_SHARE_PER_REQUEST" in answer
        assert await node.leases() == []
