"""The Kubernetes flow when a part dies at the worst moment (tests/kubeworld/cluster/): an
agent killed during a bind, the cluster side killed mid-bind, the controller's pod watch
expired (410), a Binding that landed though its answer said otherwise. The API server's
write of the bind is held open to choose the moment, or answered with a fault."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from agent.api.proto import agent_pb2 as pb
from agent.core.units import GIB
from tests.kube.test_end_to_end import LEASE, live_leases, running
from tests.kubeworld.apiserver import Obj
from tests.kubeworld.cluster.device_plugin import (
    LoopbackCluster,
    agent_call,
    eventually,
    gpu_pod,
    loopback_cluster,
    wait_agent,
    wait_healthy,
)

pytestmark = pytest.mark.timeout(240)

BINDING = r"^/api/v1/namespaces/team-a/pods/{name}/binding$"  # the binder's one write


async def lease_of_pod(cluster: LoopbackCluster, pod: str) -> tuple[str, str]:
    """(node, lease id) of the pod's live lease (exactly one)."""
    found = [(n, lease) for n, p, lease in await live_leases(cluster) if p == f"team-a/{pod}"]
    assert len(found) == 1, found
    return found[0]


async def kill_cluster_side_mid_bind(c: LoopbackCluster, pod: Obj) -> tuple[str, str]:
    """Create ``pod``, hold its Binding, SIGKILL ``gpushare kube serve`` then (the grant is
    made, the pod not bound) and let the held request go (it is dropped with its client);
    the (node, lease id) granted."""
    assert c.side_process is not None
    name = pod["metadata"]["name"]
    held = c.api_server.hold_next("POST", BINDING.format(name=name))
    await c.api_server_create(pod)
    await eventually(held.arrived.is_set)
    granted = await lease_of_pod(c, name)
    c.side_process.kill()
    c.side_process.wait(timeout=30)
    held.release.set()
    return granted


async def test_an_agent_killed_and_restarted_during_a_bind_keeps_the_lease_it_granted(
    root: Path,
) -> None:
    async with loopback_cluster(root, nodes=2) as (c, _):
        held = c.api_server.hold_next("POST", BINDING.format(name="train-0"))
        await c.apply(gpu_pod("train-0", memory="5Gi"))
        await eventually(held.arrived.is_set)  # admitted; the pod not bound
        node_name, lease_id = await lease_of_pod(c, "train-0")
        node = c.nodes[node_name]
        node.kill()
        node.start()
        await wait_agent(node, c.agent_token)
        held.release.set()

        await eventually(lambda: running(c, "team-a", "train-0"), 60)
        pod = c.api_server.pod("team-a", "train-0")
        assert pod is not None and pod["spec"]["nodeName"] == node_name
        assert pod["metadata"]["annotations"][LEASE] == lease_id
        assert c.kubelets is not None
        env = c.kubelets.env("team-a", "train-0")
        assert env["GPUSHARE_LEASE_ID"] == lease_id  # the lease was on disk before the answer
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=5120M"
        assert await lease_of_pod(c, "train-0") == (node_name, lease_id)


async def test_the_cluster_side_killed_mid_bind_leaks_nothing_after_the_reconcile(
    root: Path,
) -> None:
    async with loopback_cluster(root, nodes=2, cluster_side="process") as (c, scheduler):
        assert scheduler is not None
        pod = gpu_pod("orphan", memory="3Gi", threads="20")
        node, leaked = await kill_cluster_side_mid_bind(c, pod)
        c.api_server.delete_pod("team-a", "orphan")  # kubectl delete while nobody watches
        assert [x for x in await live_leases(c) if x[2] == leaked]  # the lease is still held

        await c.replace_cluster_side(scheduler)
        await eventually(lambda: c.api_server.pod("team-a", "orphan") is None, 60)
        for _ in range(300):
            if not await live_leases(c):
                break
            await asyncio.sleep(0.1)
        assert await live_leases(c) == [], (node, leaked)

        await c.api_server_create(gpu_pod("later", memory="3Gi", threads="20"))
        await eventually(lambda: running(c, "team-a", "later"), 60)
        assert [p for _, p, _ in await live_leases(c)] == ["team-a/later"]


async def test_a_pod_whose_bind_died_gets_the_same_lease_from_the_next_cluster_side(
    root: Path,
) -> None:
    async with loopback_cluster(root, nodes=2, cluster_side="process") as (c, scheduler):
        assert scheduler is not None
        node, granted = await kill_cluster_side_mid_bind(c, gpu_pod("retried"))

        await c.replace_cluster_side(scheduler)
        await eventually(lambda: running(c, "team-a", "retried"), 60)
        assert await lease_of_pod(c, "retried") == (node, granted)  # same request id
        assert c.kubelets is not None
        assert c.kubelets.env("team-a", "retried")["GPUSHARE_LEASE_ID"] == granted


@pytest.mark.parametrize("answer", [500, 0], ids=["500", "reset"])
async def test_a_binding_that_landed_despite_its_answer_runs_under_its_lease(
    root: Path, answer: int
) -> None:
    """The API server made the Binding, then answered 500 or broke the connection: the
    binder reads the pod back, keeps the lease, and the pod runs under it (it was released,
    the pod then ran with no live lease or was deleted as leaseless)."""
    async with loopback_cluster(root, nodes=1) as (c, scheduler):
        assert scheduler is not None
        c.api_server.fail_next("POST", BINDING.format(name="landed"), answer, landed=True)
        await c.apply(gpu_pod("landed", memory="5Gi"))
        await eventually(lambda: running(c, "team-a", "landed"), 60)
        node, lease_id = await lease_of_pod(c, "landed")
        pod = c.api_server.pod("team-a", "landed")
        assert pod is not None and pod["metadata"]["annotations"][LEASE] == lease_id
        assert c.kubelets is not None
        assert c.kubelets.env("team-a", "landed")["GPUSHARE_LEASE_ID"] == lease_id
        assert scheduler.attempts[pod["metadata"]["uid"]] == 1  # one bind: it was done
        await asyncio.sleep(5)  # reconciles and leaseless checks (grace 2 s) come and go
        assert c.api_server.pod("team-a", "landed") is not None
        assert await lease_of_pod(c, "landed") == (node, lease_id)


async def test_a_pod_watch_expired_with_410_is_listed_again_and_nothing_is_missed(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.legacy.cluster.controller")
    async with loopback_cluster(root, nodes=2) as (c, _):
        await c.apply(gpu_pod("short"))
        await eventually(lambda: running(c, "team-a", "short"))
        assert len(await live_leases(c)) == 1

        watch = c.api_server.hold_next("GET", r"schedulerName.*watch=|watch=.*schedulerName")
        c.api_server.end_watches()  # the controller lists again, then watches from there
        await eventually(watch.arrived.is_set)
        c.api_server.delete_pod("team-a", "short")  # happens while the watch is not open
        c.api_server.compact()  # ... and the version it watches from is compacted away
        watch.release.set()

        await eventually(lambda: c.api_server.pod("team-a", "short") is None, 30)
        assert await live_leases(c) == []
        assert "pod watch expired (410)" in caplog.text


async def test_a_pod_whose_lease_was_evicted_while_the_cluster_side_was_down_is_deleted(
    root: Path,
) -> None:
    """No ``lease.evicted`` event reaches the next cluster side (it follows the agent from
    its newest event): its reconcile finds the pod bound to a lease that is gone, with no
    container running."""
    async with loopback_cluster(root, nodes=1, cluster_side="process") as (c, scheduler):
        assert scheduler is not None and c.side_process is not None
        await c.api_server_create(
            gpu_pod("victim", memory="40Gi", threads="10", priority="best-effort")
        )
        await eventually(lambda: running(c, "team-a", "victim"), 60)
        node, evicted = await lease_of_pod(c, "victim")
        c.side_process.kill()
        c.side_process.wait(timeout=30)

        # guaranteed requests fill every device; the last one fits only by preemption
        preempted = []
        for i in range(4):
            answer = await agent_call(
                c.nodes[node], c.agent_token, "admit", request_id=f"big-{i}", tenant="ops",
                trust_domain="ops", priority=pb.GUARANTEED, memory_bytes=78 * GIB,
                thread_pct=10,
            )  # fmt: skip
            assert answer.decision.admitted, answer.decision.message
            preempted += answer.decision.preempted_lease_ids
        assert preempted == [evicted]
        # its MPS client ended with the lease; the kubelet cannot create the container again
        waiting = {"waiting": {"reason": "CreateContainerError"}}
        c.api_server.patch_pod(
            "team-a",
            "victim",
            {"status": {"containerStatuses": [{"name": "main", "state": waiting}]}},
            subresource="status",
        )

        await c.replace_cluster_side(scheduler)
        await eventually(lambda: c.api_server.pod("team-a", "victim") is None, 60)
        [event] = [
            e for e in c.api_server.events_for("victim", "team-a") if e["reason"] == "LeaseEvicted"
        ]
        assert f"lease {evicted} is no longer live there" in event["message"]


def lease_holder(c: LoopbackCluster) -> tuple[str, int]:
    """(holderIdentity, leaseTransitions) of `kube serve`'s leader election Lease."""
    stored = c.api_server.objects["leases"].get(("gpushare-system", "gpushare-kube-serve"))
    spec = (stored or {}).get("spec") or {}
    return str(spec.get("holderIdentity") or ""), int(spec.get("leaseTransitions") or 0)


async def test_a_second_replica_takes_over_the_controller_when_the_leader_is_killed(
    root: Path,
) -> None:
    """Two `kube serve` replicas: one leads (its controller releases leases), the other
    binds (kube-scheduler's own leader may sit beside either) but writes nothing else; the
    leader SIGKILLed, the other takes the Lease within the lease duration and its
    controller settles a pod deleted meanwhile."""
    async with loopback_cluster(root, nodes=2, cluster_side="process") as (c, scheduler):
        assert scheduler is not None and c.side_process is not None
        first = c.side_process
        await eventually(lambda: lease_holder(c)[0] != "")
        leader = lease_holder(c)[0]
        second = c.spawn_cluster_side(name="replica-2")
        c.side_process = first  # the cluster's teardown kills the first; this test the second
        try:
            await wait_healthy(c.extender_url, second)
            scheduler.extender_url = c.extender_url  # binds through the replica not leading
            await c.api_server_create(gpu_pod("survivor", memory="3Gi", threads="20"))
            await eventually(lambda: running(c, "team-a", "survivor"), 60)
            assert lease_holder(c) == (leader, 0)  # the second did not take it
            assert "leads" not in (root / "replica-2.log").read_text()

            first.kill()
            first.wait(timeout=30)
            c.api_server.delete_pod("team-a", "survivor")  # its finalizer waits for a leader
            await eventually(lambda: c.api_server.pod("team-a", "survivor") is None, 60)
            assert await live_leases(c) == []
            taken_by, transitions = lease_holder(c)
            assert taken_by not in ("", leader) and transitions == 1
            assert f"{taken_by} leads" in (root / "replica-2.log").read_text()

            await c.api_server_create(gpu_pod("after", memory="3Gi", threads="20"))
            await eventually(lambda: running(c, "team-a", "after"), 60)
            second.terminate()  # a clean stop hands the Lease back (to this loop's API server)
            assert await asyncio.to_thread(second.wait, 30) == 0
            assert lease_holder(c) == ("", 1), (root / "replica-2.log").read_text()[-3000:]
        finally:
            if second.poll() is None:
                second.kill()
                second.wait(timeout=30)
        assert "Traceback" not in (root / "replica-2.log").read_text()
