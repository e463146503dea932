"""A node's reboot with claims prepared, on the loopback cluster with a real agent: the
CDI directory (``/var/run/cdi``, a tmpfs) is empty after it, and the kubelet, whose
checkpoint says the claims are prepared, does not call NodePrepareResources again; it only
creates the pods' containers again, which the runtime resolves against the specs on disk
(Kubernetes issue 141433: a driver that does not write its specs again leaves those pods
failing for good). So the agent writes at its start the spec of every claim still
prepared, the same as before, and not the spec of a claim unprepared before the reboot.

The reboot, as the stand-ins play it: the kubelet's stand-in stops (its claim records, the
checkpoint, are kept), the agent is stopped (SIGKILL, or SIGTERM), the node's CDI directory
is removed, then the kubelet starts again, the agent's process too, and the kubelet
creates the running pods' containers again (:meth:`DraKubelet.run_pod` for a pod whose
claims it has prepared calls no driver).
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.dra.test_end_to_end import running
from tests.kubeworld.cluster.dra import (
    DRIVER,
    DraCluster,
    DraNode,
    claim_pod,
    claim_template,
    dra_cluster,
    eventually,
    with_extended_claim,
)
from tests.kubeworld.kubelet import FakeContainer

pytestmark = pytest.mark.timeout(120)
SPECS_BACK_S = 30.0  # how long the specs may take to come back after the start
RESOURCE_API = "/apis/resource.k8s.io/v1"


def stored_pod(cluster: DraCluster, name: str) -> dict[str, Any]:
    found = cluster.api_server.pod("default", name)
    assert found is not None, name
    return found


def prepare_calls(node: DraNode) -> int:
    return sum(1 for c in node.kubelet.calls if c.method == "NodePrepareResources")


async def reboot(node: DraNode, stop: str) -> None:
    """Everything on the node stops, /var/run/cdi is lost, the kubelet and the agent start.
    A power cut also loses what was never synced to the disk: the kept records of the
    claims with leases and the claims' index entries (only the ledger is synced)."""
    await node.kubelet.stop()
    await asyncio.to_thread(node.stop if stop == "SIGTERM" else node.kill)
    shutil.rmtree(node.cdi_dir)
    if stop == "power cut":
        kept = node.root / "state" / "cdi"
        lost = [*kept.glob("*.json"), *(kept / "claims").glob("*.json")]
        assert lost, f"nothing kept under {kept}"
        for path in lost:
            path.unlink()
    await node.kubelet.start()
    node.start()
    await node.wait_ready()


async def specs_back(node: DraNode, expected: dict[str, Any]) -> None:
    """Until the node's specs are those of ``expected`` (claim uid -> spec), or fail
    saying which are missing, which are there that should not be, which differ."""
    try:
        await eventually(lambda: node.specs() == expected, SPECS_BACK_S)
    except TimeoutError:
        now = node.specs()
        raise AssertionError(
            f"CDI specs after the restart: missing {sorted(set(expected) - set(now))}, "
            f"not expected {sorted(set(now) - set(expected))}, differing "
            f"{sorted(u for u in set(now) & set(expected) if now[u] != expected[u])}"
        ) from None


def claim_reads(cluster: DraCluster, node: DraNode) -> int:
    """GETs the API stand-in served of one claim of the node (the first of its specs'),
    by name: the agent's claim reconcile reads each claim of the node once a pass."""
    uid = min(node.specs())
    [claim] = [c for c in cluster.claims() if c["metadata"]["uid"] == uid]
    path = f"{RESOURCE_API}/namespaces/default/resourceclaims/{claim['metadata']['name']}"
    return sum(
        1
        for method, logged, _ in cluster.api_server.log
        if method == "GET" and logged.split("?")[0] == path
    )


async def a_reconcile_pass(cluster: DraCluster, node: DraNode) -> None:
    """Until the agent's claim reconcile has made a whole pass from now: three reads more
    of one claim (passes follow one another: the first read's pass began before now or
    after, the second's began after it ended, the third's after the second's ended)."""
    start = claim_reads(cluster, node)
    await eventually(lambda: claim_reads(cluster, node) >= start + 3, 30)


async def containers_again(
    cluster: DraCluster, node: DraNode, pod: str
) -> dict[str, FakeContainer]:
    """The pod's containers created again by the kubelet after the reboot."""
    return await node.kubelet.run_pod(with_extended_claim(stored_pod(cluster, pod)))


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM", "power cut"])
async def test_the_specs_of_the_claims_still_prepared_are_back_after_a_reboot(
    root: Path, stop: str
) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        runner = cluster.running
        await cluster.apply(claim_template("t", memory="4Gi", threads="25"))
        kept, names = ("a", "b", "c"), ("a", "b", "c", "gone")
        for name in names:
            await cluster.apply(claim_pod(name, "t"))
        await running(cluster, *names)
        claims = {name: cluster.claim_uid(name) for name in names}
        # one pod stops before the reboot: its claim is unprepared (the pod is still
        # terminating, its claim still allocated and reserved for it)
        gone_pod = stored_pod(cluster, "gone")["metadata"]["uid"]
        cluster.api_server.delete_pod("default", "gone")
        await eventually(lambda: gone_pod in runner.stopped, 30)
        assert runner.stopped[gone_pod] == {claims["gone"]: ""}
        before = node.specs()
        assert sorted(before) == sorted(claims[n] for n in kept)
        leases = await node.lease_ids()
        assert sorted(leases) == sorted(claims[n] for n in kept)
        envs = {name: runner.env("default", name) for name in kept}
        prepares = prepare_calls(node)

        await reboot(node, stop)

        await specs_back(node, before)  # parsed, equal: the same edits, the same lease ids
        await a_reconcile_pass(cluster, node)
        assert node.specs() == before  # and they stay; the unprepared claim's is not back
        assert await node.lease_ids() == leases
        for name in kept:  # the containers come back as they were, with no Prepare
            containers = await containers_again(cluster, node, name)
            assert not containers["main"].error, containers["main"].error
            assert containers["main"].env == envs[name], name
        assert prepare_calls(node) == prepares

        # Unprepare after the reboot releases, as before
        a_pod = stored_pod(cluster, "a")["metadata"]["uid"]
        cluster.api_server.delete_pod("default", "a", force=True)
        await eventually(lambda: a_pod in runner.stopped, 30)
        assert runner.stopped[a_pod] == {claims["a"]: ""}
        assert claims["a"] not in await node.lease_ids()
        assert not node.spec_file(claims["a"]).exists()


def admin_claim(node: str, name: str) -> dict[str, Any]:
    """A claim allocated with ``adminAccess`` on the node's gpu-0 (the device, no share),
    as the scheduler leaves it; made here, since no binding condition waits on it."""
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"}
    result["adminAccess"] = True
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "adminAccess": True}}
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {"nodeSelectorTerms": [term]},
            }
        },
    }


def bound_pod(name: str, node: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "securityContext": {"runAsUser": 1000},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {"name": "main", "image": "dcgm", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


async def test_an_admin_access_claims_spec_is_back_after_a_reboot(root: Path) -> None:
    """A monitoring pod's ``adminAccess`` claim beside a share's: both specs come back."""
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("t", memory="4Gi"))
        await cluster.apply(claim_pod("share", "t"))
        name = f"admin-{uuid.uuid4().hex[:6]}"
        claim = cluster.api_server.put_object("resourceclaims", admin_claim(node.name, name))
        pod = await cluster.apply(bound_pod("monitor", node.name, name))
        claim["status"]["reservedFor"] = [
            {"resource": "pods", "name": "monitor", "uid": pod["metadata"]["uid"]}
        ]
        cluster.api_server.put_object("resourceclaims", claim)
        await running(cluster, "share", "monitor")
        admin_uid = claim["metadata"]["uid"]
        assert admin_uid in node.specs(), "the adminAccess claim got no CDI spec at Prepare"
        await a_reconcile_pass(cluster, node)
        before = node.specs()
        assert admin_uid in before, "the adminAccess claim's spec was removed while it runs"
        assert sorted(before) == sorted([admin_uid, cluster.claim_uid("share")])
        envs = {n: cluster.running.env("default", n) for n in ("share", "monitor")}
        assert envs["monitor"]["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
        prepares = prepare_calls(node)

        await reboot(node, "SIGKILL")

        await specs_back(node, before)
        for name in ("share", "monitor"):
            containers = await containers_again(cluster, node, name)
            assert not containers["main"].error, containers["main"].error
            assert containers["main"].env == envs[name], name
        assert prepare_calls(node) == prepares
        await a_reconcile_pass(cluster, node)
        assert node.specs() == before  # the claim is allocated here, though it holds no lease
