"""The DRA driver end to end on the loopback cluster: real ``gpushare serve --sim`` agents
as the driver, the kubelet's and the scheduler's stand-ins speaking their real APIs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.core.units import GIB, MIB
from tests.helpers import REPO, short_dir
from tests.kubeworld.cluster.dra import (
    DRIVER,
    DraCluster,
    claim_pod,
    claim_template,
    dra_cluster,
    eventually,
)

pytestmark = pytest.mark.timeout(240)
PROFILES = REPO / "profiles"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def one_gpu_node(root: Path) -> Path:
    path = root / "node.yaml"
    path.write_text("version: 1\ndevices:\n  - model: H100-SXM5-80GB\n    memory: 80GiB\n")
    return path


async def running(cluster: DraCluster, *names: str, namespace: str = "default") -> None:
    """Until each pod has run (its containers created), or fail with why not."""
    runner = cluster.running

    def started() -> bool:
        return all((namespace, n) in runner.containers for n in names)

    try:
        await eventually(started, 60)
    except TimeoutError:
        raise AssertionError(
            f"not started: {[n for n in names if (namespace, n) not in runner.containers]}; "
            f"errors {runner.errors}; scheduler failures {cluster.scheduler.failures[-5:]}"  # type: ignore[union-attr]
        ) from None


def pool_of(claim: dict[str, Any]) -> str:
    return str(claim["status"]["allocation"]["devices"]["results"][0]["pool"])


def claim_of(cluster: DraCluster, pod: str) -> dict[str, Any]:
    [found] = [c for c in cluster.claims() if c["metadata"]["name"].startswith(f"{pod}-gpu-")]
    return found


async def leases_by_pod(cluster: DraCluster) -> dict[str, Any]:
    return {x.pod: x for leases in (await cluster.all_leases()).values() for x in leases}


async def test_a_pod_with_a_claim_runs_with_exactly_its_shares_limits(root: Path) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        [published] = cluster.slices()
        gpu0 = published["spec"]["devices"][0]
        assert published["spec"]["pool"] == {
            "name": node.name, "generation": published["spec"]["pool"]["generation"],
            "resourceSliceCount": 1,
        }  # fmt: skip
        assert gpu0["capacity"]["memory"]["value"] == "71Gi"  # 80 - 1 reserve - 16 x 0.5
        assert gpu0["attributes"]["productName"] == {"string": "H100-SXM5-80GB"}

        await cluster.apply(claim_template("quarter-gpu", memory="20Gi", threads="25"))
        await cluster.apply(claim_pod("app", "quarter-gpu"))
        await running(cluster, "app")

        env = cluster.running.env("default", "app")
        claim = claim_of(cluster, "app")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["consumedCapacity"]["memory"] == "20Gi"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith(f"={20 * GIB // MIB}M")
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        container = cluster.running.containers[("default", "app")]["main"]
        assert any(m["containerPath"] == pipe for m in container.mounts)
        leases = await leases_by_pod(cluster)
        lease = leases["default/app"]
        assert env["GPUSHARE_LEASE_ID"] == lease.lease_id
        assert lease.memory_bytes == 20 * GIB and lease.thread_pct == 25
        assert lease.request_id.startswith(f"dra:{claim['metadata']['uid']}:")
        spec = node.cdi_dir / f"gpushare.io-claim_{claim['metadata']['uid']}.json"
        assert json.loads(spec.read_text())["kind"] == "gpushare.io/claim"
        assert "leases reach pods by dra" in await node.cli("status")  # the on-call view
        # the binding answer the scheduler waited for
        [answer] = claim["status"]["devices"]
        assert answer["conditions"][0]["type"] == "gpushare.io/admitted"

        cluster.api_server.delete_pod("default", "app", force=True)
        await eventually(lambda: not spec.exists(), 30)
        assert not await node.leases()


async def test_eight_pods_at_once_on_one_gpu_each_get_their_own_lease(root: Path) -> None:
    node_file = one_gpu_node(root)
    async with dra_cluster(root, nodes=1, settings={"sim.node_file": node_file}) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("eighth", memory="8Gi", threads="12"))
        names = [f"p{i}" for i in range(8)]
        await asyncio.gather(*(cluster.apply(claim_pod(n, "eighth")) for n in names))
        await running(cluster, *names)
        leases = await node.leases()
        assert len(leases) == 8
        assert len({x.lease_id for x in leases}) == 8
        assert sum(x.memory_bytes for x in leases) <= 71 * GIB
        for name in names:  # each container has its own claim's lease, and no other
            env = cluster.running.env("default", name)
            mine = [x for x in leases if x.pod == f"default/{name}"]
            assert [env["GPUSHARE_LEASE_ID"]] == [x.lease_id for x in mine]


async def test_a_share_that_would_overfill_its_device_is_never_prepared(root: Path) -> None:
    """The driver is the last line of defense: a claim allocated by someone who got the
    sums wrong is refused at Prepare, with the ledger's reason, and prepares nothing."""
    node_file = one_gpu_node(root)
    async with dra_cluster(root, nodes=1, settings={"sim.node_file": node_file}) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("big", memory="60Gi"))
        await cluster.apply(claim_pod("first", "big"))
        await running(cluster, "first")
        forged = dict(claim_of(cluster, "first"))
        forged["metadata"] = {"name": "forged", "namespace": "default"}
        allocation = json.loads(json.dumps(forged["status"]["allocation"]))
        allocation["devices"]["results"][0]["shareID"] = "5e0e2d4c-1111-4222-8333-444455556666"
        pod = cluster.api_server.create_pod("second", run_as_user=1000)
        status = {
            "allocation": allocation,
            "reservedFor": [{"resource": "pods", "name": "second", "uid": pod["metadata"]["uid"]}],
        }
        forged_claim = cluster.api_server.put_object(
            "resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "forged", "namespace": "default"},
                "spec": forged["spec"],
                "status": status,
            },
        )
        ref = forged_claim["metadata"]
        answer = await node.kubelet.prepare([forged_claim])
        error = answer[forged_claim["metadata"]["uid"]]
        assert isinstance(error, str) and "NO_MEMORY" in error
        assert len(await node.leases()) == 1
        assert not (node.cdi_dir / f"gpushare.io-claim_{ref['uid']}.json").exists()


class FirstNode:
    """A scheduler's node order that tries ``first`` before the others."""

    def __init__(self, first: str) -> None:
        self.first = first

    def shuffle(self, names: list[str]) -> None:
        names.sort(key=lambda n: n != self.first)


async def test_a_protected_device_refuses_a_noisy_share_and_the_pod_lands_elsewhere(
    root: Path,
) -> None:
    settings = {"estimator.profiles_dir": PROFILES, "estimator.model_dir": "default"}
    async with dra_cluster(root, nodes=2, settings=settings) as cluster:
        serve = claim_template("serve", memory="20Gi", threads="50")
        serve["spec"]["spec"]["devices"]["config"] = [
            {
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": "gpushare.io/v1",
                        "kind": "ShareConfig",
                        "priority": "guaranteed",
                        "profile": "llm-7b-serve",
                    },
                }
            }
        ]
        await cluster.apply(serve)
        await cluster.apply(claim_pod("llm", "serve"))
        await running(cluster, "llm")
        protected_node = pool_of(claim_of(cluster, "llm"))
        assert cluster.scheduler is not None  # the next pod tries the protected node first
        cluster.scheduler.rng = FirstNode(protected_node)  # type: ignore[assignment]
        await cluster.apply(claim_template("noisy", memory="10Gi", threads="100"))
        await cluster.apply(claim_pod("heavy", "noisy"))
        await running(cluster, "heavy")
        scheduler = cluster.scheduler
        assert scheduler is not None
        refusals = [m for pod, m in scheduler.failures if pod.endswith("heavy")]
        assert refusals and "RETENTION_BELOW_FLOOR" in refusals[0], (
            protected_node,
            claim_of(cluster, "heavy")["status"],
        )
        landed = claim_of(cluster, "heavy")["status"]["allocation"]["devices"]["results"][0]["pool"]
        assert landed != protected_node
        leases = await cluster.nodes[protected_node].leases()
        assert [x.pod for x in leases] == ["default/llm"]  # the refused share left nothing
        [published] = cluster.slices(protected_node)
        assert published["spec"]["devices"][0]["attributes"]["protected"] == {"bool": True}


async def test_a_drained_device_is_tainted_and_takes_no_new_share(root: Path) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        [before] = cluster.slices()
        uuid = before["spec"]["devices"][0]["attributes"]["uuid"]["string"]
        await node.cli("drain", uuid, "--reason", "maintenance")

        def tainted() -> bool:
            [now] = cluster.slices()
            return bool(now["spec"]["devices"][0].get("taints"))

        await eventually(tainted, 30)
        [after] = cluster.slices()
        assert after["spec"]["pool"]["generation"] > before["spec"]["pool"]["generation"]
        assert after["spec"]["devices"][0]["taints"][0]["key"] == "gpushare.io/drained"
        await cluster.apply(claim_template("t", memory="4Gi"))
        await cluster.apply(claim_pod("p", "t"))
        await running(cluster, "p")
        landed = claim_of(cluster, "p")["status"]["allocation"]["devices"]["results"][0]
        assert landed["device"] != "gpu-0"


async def test_force_delete_and_kill_9_and_restart_leak_nothing_and_prepare_nothing_twice(
    root: Path,
) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("t", memory="4Gi"))
        for name in ("a", "b", "c"):
            await cluster.apply(claim_pod(name, "t"))
        await running(cluster, "a", "b", "c")
        before = {x.pod: x.lease_id for x in await node.leases()}

        # a restart with claims prepared: the kubelet prepares them again, the same leases
        node.stop()
        node.start()
        await node.wait_ready()
        again = await node.kubelet.prepare([claim_of(cluster, "a")])
        assert not isinstance(next(iter(again.values())), str)
        assert {x.pod: x.lease_id for x in await node.leases()} == before

        # kill -9 between Prepare and Unprepare; the pod is force-deleted meanwhile
        node.kill()
        spec_b = (
            node.cdi_dir / f"gpushare.io-claim_{claim_of(cluster, 'b')['metadata']['uid']}.json"
        )
        cluster.api_server.delete_pod("default", "b", force=True)
        node.start()
        await node.wait_ready()
        await eventually(lambda: not spec_b.exists(), 30)
        left = {x.pod for x in await node.leases()}
        assert left == {"default/a", "default/c"}

        # a force-delete with the agent up
        cluster.api_server.delete_pod("default", "c", force=True)

        async def only_a() -> bool:
            return {x.pod for x in await node.leases()} == {"default/a"}

        async with asyncio.timeout(30):
            while not await only_a():
                await asyncio.sleep(0.1)
        specs = sorted(p.name for p in node.cdi_dir.iterdir())
        assert specs == [f"gpushare.io-claim_{claim_of(cluster, 'a')['metadata']['uid']}.json"]


async def test_an_mps_daemon_down_taints_its_device_and_the_kubelet_hears_it_unhealthy(
    root: Path,
) -> None:
    settings = {"mps.probe_interval_s": 0.2, "mps.restart_backoff_initial_s": 4.0}
    async with dra_cluster(root, nodes=1, settings=settings) as cluster:
        [node] = cluster.nodes.values()
        key = (node.name, "gpu-0")
        await node.kubelet.wait_for(
            lambda: node.kubelet.health(DRIVER).get(key, ("",))[0] == "Healthy"
        )
        state = await node.call("get_node")
        [daemon] = [m for m in state.mps if m.device_uuid == state.devices[0].uuid]
        os.kill(daemon.pid, signal.SIGKILL)  # an MPS fault: the control daemon is gone

        def device0() -> dict[str, Any]:
            [published] = cluster.slices()
            return dict(published["spec"]["devices"][0])

        await eventually(lambda: bool(device0().get("taints")), 20)
        assert device0()["taints"][0]["key"] == "gpushare.io/mps-down"
        await node.kubelet.wait_for(lambda: node.kubelet.health(DRIVER)[key][0] == "Unhealthy", 20)
        assert "MPS control daemon" in node.kubelet.health(DRIVER)[key][1]
        # restarted by its supervisor: healthy and untainted again
        await eventually(lambda: not device0().get("taints"), 30)
        await node.kubelet.wait_for(lambda: node.kubelet.health(DRIVER)[key][0] == "Healthy", 20)


async def test_mig_instances_are_devices_of_their_own(root: Path) -> None:
    node_file = root / "mig.yaml"
    node_file.write_text(
        "version: 1\ndevices:\n  - model: A100-SXM4-80GB\n    memory: 80GiB\n    mig:\n"
        "      - {profile: 3g.40gb, memory: 40GiB}\n      - {profile: 3g.40gb, memory: 40GiB}\n"
    )
    async with dra_cluster(root, nodes=1, settings={"sim.node_file": node_file}) as cluster:
        [published] = cluster.slices()
        names = [d["name"] for d in published["spec"]["devices"]]
        assert len(names) == 2 and all(n.startswith("gpu-0-mig-") for n in names)
        assert published["spec"]["devices"][0]["capacity"]["memory"]["value"] == "31Gi"
        await cluster.apply(claim_template("t", memory="20Gi"))
        await cluster.apply(claim_pod("p", "t"))
        await running(cluster, "p")
        result = claim_of(cluster, "p")["status"]["allocation"]["devices"]["results"][0]
        assert result["device"] in names
        env = cluster.running.env("default", "p")
        [lease] = await next(iter(cluster.nodes.values())).leases()
        assert env["NVIDIA_VISIBLE_DEVICES"] == lease.device_uuid
