"""The user a claim's shares run as (issue 38): one MPS server serves one UID at a time, so
the DRA driver reads the UID from the pods a claim is reserved for and the ledger keeps
one user per MPS device.

At the binding answer (``AnswerClaim``, a real simulated agent over gRPC, pods in the API
stand-in): a share takes its pods' UID; a pod that states none is refused saying how to fix
it; another UID on a device is refused there (the device backs off) and admitted on the
other; a claim used by pods of two UIDs is refused; a pod that cannot be read is an error
the controller asks again about; the rule can be switched off.

End to end on the loopback DRA cluster (scheduler stand-in, kubelets, binding controller,
real agents): two pods of different users land on two GPUs; on a one-GPU node the second
waits with its reason and runs when the first ends; two pods of one user share the GPU."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from agent.core.podusers import FIX
from agent.dra.port import ClaimRef
from agent.runtime.app import App
from tests.dra.fixtures import NODE, claim_user_pod, reserve
from tests.dra.test_answer_claim import ask, claim, client, leases, result, taints, until
from tests.dra.test_claim_answers import allocated_claim
from tests.dra.test_claim_answers import result as plain_result
from tests.dra.test_end_to_end import one_gpu_node, running
from tests.dra.test_reconcile_node import parts
from tests.kubeworld.apiserver import FakeApiServer
from tests.kubeworld.cluster.dra import claim_pod, claim_template, dra_cluster, eventually


def reserved_for(api: FakeApiServer, asked: dict[str, Any], *uids: int | None) -> dict[str, Any]:
    """``asked`` reserved for a pod of each of ``uids`` (None: a pod that states no user),
    whose container uses it."""
    name = asked["metadata"]["name"]
    return reserve(
        asked, *(claim_user_pod(api, asked, f"{name}-p{i}", u) for i, u in enumerate(uids))
    )


async def test_a_share_runs_as_its_pods_user(agent: App, api: FakeApiServer) -> None:
    asked = reserved_for(api, claim(result("gpu-0")), 1000)
    assert [a[2:] for a in await ask(agent, asked)] == [(True, "Admitted")]
    [lease] = await leases(agent)
    assert lease.HasField("run_as_uid") and lease.run_as_uid == 1000


async def test_a_pod_that_states_no_user_is_refused_saying_how_to_fix_it(
    agent: App, api: FakeApiServer
) -> None:
    asked = reserved_for(api, claim(result("gpu-0")), None)
    async with client(agent) as c:
        [answer] = (await c.answer_claim(asked)).answers
    assert (answer.admitted, answer.reason) == (False, "RUN_AS_USER_REQUIRED")
    assert f"container {asked['metadata']['name']}-p0/main states no user" in answer.message
    assert FIX in answer.message
    assert await leases(agent) == []
    assert "gpushare.io/refused" not in taints(api, "gpu-0")  # the pod's fault, not the GPU's


async def test_another_user_is_refused_on_the_device_and_admitted_on_the_other(
    agent: App, api: FakeApiServer
) -> None:
    first = reserved_for(api, claim(result("gpu-0")), 1000)
    assert [a[2:] for a in await ask(agent, first)] == [(True, "Admitted")]
    other = reserved_for(api, claim(result("gpu-0")), 2000)
    async with client(agent) as c:
        [answer] = (await c.answer_claim(other)).answers
    assert (answer.admitted, answer.reason) == (False, "USER_CONFLICT")
    assert "1000" in answer.message
    await until(lambda: "gpushare.io/refused" in taints(api, "gpu-0"))  # it backs off
    elsewhere = reserved_for(api, claim(result("gpu-1")), 2000)
    assert [a[2:] for a in await ask(agent, elsewhere)] == [(True, "Admitted")]
    same_user = reserved_for(api, claim(result("gpu-0")), 1000)
    assert [a[2:] for a in await ask(agent, same_user)] == [(True, "Admitted")]
    users = {x.device_uuid: set() for x in await leases(agent)}
    for x in await leases(agent):
        users[x.device_uuid].add(x.run_as_uid)
    assert sorted(map(sorted, users.values())) == [[1000], [2000]]


async def test_a_claim_used_by_pods_of_two_users_is_refused(agent: App, api: FakeApiServer) -> None:
    asked = reserved_for(api, claim(result("gpu-0")), 1000, 2000)
    async with client(agent) as c:
        [answer] = (await c.answer_claim(asked)).answers
    assert (answer.admitted, answer.reason) == (False, "USER_CONFLICT")
    assert "pods of different users (UIDs 1000, 2000)" in answer.message
    assert await leases(agent) == []
    assert "gpushare.io/refused" not in taints(api, "gpu-0")


async def test_pods_gone_or_replaced_do_not_count(agent: App, api: FakeApiServer) -> None:
    asked = reserved_for(api, claim(result("gpu-0")), None, 1000)
    gone, kept = asked["status"]["reservedFor"]
    api.delete_pod(asked["metadata"]["namespace"], gone["name"], force=True)
    asked["status"]["reservedFor"].append({"resource": "pods", "name": kept["name"], "uid": "x"})
    assert [a[2:] for a in await ask(agent, asked)] == [(True, "Admitted")]
    [lease] = await leases(agent)
    assert lease.run_as_uid == 1000


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ({"status": 500}, grpc.StatusCode.UNAVAILABLE),
        ({"status": 403, "reason": "Forbidden"}, grpc.StatusCode.UNAVAILABLE),
        ({"status": 0, "times": 2}, grpc.StatusCode.UNAVAILABLE),
        # timed out: no answer at all, or the read served and its answer lost
        ({"hang": True}, grpc.StatusCode.UNAVAILABLE),
        ({"status": 0, "landed": True, "times": 2}, grpc.StatusCode.UNAVAILABLE),
    ],
)
@pytest.mark.parametrize("extra_settings", [{"dra.api_timeout_s": 0.5}])
async def test_a_pod_that_cannot_be_read_is_an_error_asked_again_later(
    agent: App, api: FakeApiServer, fault: dict[str, Any], code: grpc.StatusCode
) -> None:
    asked = reserved_for(api, claim(result("gpu-0")), 1000)
    api.fail_next("GET", r"/pods/", **fault)
    async with client(agent) as c:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await c.answer_claim(asked)
    assert caught.value.code() is code
    assert "cannot read pod" in (caught.value.details() or "")
    assert await leases(agent) == []
    assert [a[2:] for a in await ask(agent, asked)] == [(True, "Admitted")]  # asked again


@pytest.mark.parametrize("extra_settings", [{"dra.require_run_as_user": False}])
async def test_with_the_rule_off_a_pod_without_a_user_is_admitted_unchecked(
    agent: App, api: FakeApiServer
) -> None:
    asked = reserved_for(api, claim(result("gpu-0")), None)
    assert [a[2:] for a in await ask(agent, asked)] == [(True, "Admitted")]
    [lease] = await leases(agent)
    assert not lease.HasField("run_as_uid")


def two_request_claim(api: FakeApiServer, *requests_of: tuple[str, ...]) -> dict[str, Any]:
    """A claim of two requests (r1 on gpu-0, r2 on gpu-1) reserved for a pod whose
    containers use the requests ``requests_of`` names (an empty tuple: the whole claim)."""
    asked = claim(result("gpu-0", "r1"), result("gpu-1", "r2"))
    name, namespace = asked["metadata"]["name"], asked["metadata"]["namespace"]
    containers = []
    for index, requests in enumerate(requests_of):
        entries = [{"name": "gpu", "request": r} for r in requests] or [{"name": "gpu"}]
        containers.append({"name": f"c{index}", "image": "app", "resources": {"claims": entries}})
    pod = api.put_object(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-pod", "namespace": namespace},
            "spec": {
                "securityContext": {"runAsUser": 1000},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": containers,
            },
        },
    )
    ref = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    asked["status"]["reservedFor"] = [ref]
    return asked


async def test_a_container_given_shares_on_two_gpus_is_refused_before_placement(
    agent: App, api: FakeApiServer
) -> None:
    """One process reaches one MPS server: never two pipe directories in one container."""
    asked = two_request_claim(api, ())
    async with client(agent) as c:
        answers = (await c.answer_claim(asked)).answers
    assert {(a.admitted, a.reason) for a in answers} == {(False, "ONE_GPU_PER_CONTAINER")}
    assert "(gpu-0, gpu-1)" in answers[0].message
    assert await leases(agent) == []
    assert "gpushare.io/refused" not in taints(api, "gpu-0")
    # each container its own request: each served on its GPU, by one server
    served = two_request_claim(api, ("r1",), ("r2",))
    assert [a[2:] for a in await ask(agent, served)] == [(True, "Admitted")] * 2


async def test_a_pod_of_another_user_joining_a_shared_claim_is_told_once(
    agent: App, api: FakeApiServer
) -> None:
    """A shared claim's next pod gets no binding answer and no Prepare: the reconcile reads
    it once, and a pod of another user (which MPS would keep waiting) is an event."""
    stored = api.put_object("resourceclaims", reserved_for(api, claim(result("gpu-0")), 1000))
    assert [a[2:] for a in await ask(agent, stored)] == [(True, "Admitted")]
    _, reconciler = parts(agent)
    await reconciler.once()
    reserve(stored, claim_user_pod(api, stored, "same", 1000))
    api.put_object("resourceclaims", stored)
    await reconciler.once()
    assert await user_conflicts(agent) == [], "a pod of the share's user is welcome"
    reserve(
        stored,
        claim_user_pod(api, stored, "other", 2000),
        claim_user_pod(api, stored, "nouser", None),
    )
    api.put_object("resourceclaims", stored)
    before = api.requests["get"]
    await reconciler.once()
    assert api.requests["get"] - before == 3, "the claim, and each pod that joined"
    await reconciler.once()  # read once: told once
    assert api.requests["get"] - before == 4
    [told] = await user_conflicts(agent)
    assert "run as UID 2000 and state no user" in told and "run as UID 1000 " not in told
    assert "while its shares here run as UID 1000" in told
    [lease] = await leases(agent)
    assert lease.run_as_uid == 1000, "the share stands"


async def user_conflicts(agent: App) -> list[str]:
    assert await agent.events.flush()
    return [e.message for e in agent.events.since(0) if e.kind == "dra.user_conflict"]


@pytest.mark.parametrize("extra_settings", [{"mps.multi_user": True}])
async def test_with_multi_user_daemons_two_users_share_a_claim_and_a_device(
    agent: App, api: FakeApiServer
) -> None:
    """Daemons started with -M serve several users at once: no one-user rule, no UID
    required, and a pod of another user joining is nothing to tell."""
    stored = api.put_object("resourceclaims", reserved_for(api, claim(result("gpu-0")), 1000, 2000))
    assert [a[2:] for a in await ask(agent, stored)] == [(True, "Admitted")]
    other = reserved_for(api, claim(result("gpu-0")), None)
    assert [a[2:] for a in await ask(agent, other)] == [(True, "Admitted")]
    reserve(stored, claim_user_pod(api, stored, "third", 3000))
    api.put_object("resourceclaims", stored)
    _, reconciler = parts(agent)
    await reconciler.once()
    assert await user_conflicts(agent) == []


async def test_a_joined_pod_that_cannot_be_read_is_read_by_the_next_pass(
    agent: App, api: FakeApiServer
) -> None:
    stored = api.put_object("resourceclaims", reserved_for(api, claim(result("gpu-0")), 1000))
    assert [a[2:] for a in await ask(agent, stored)] == [(True, "Admitted")]
    reserve(stored, claim_user_pod(api, stored, "late", 2000))
    api.put_object("resourceclaims", stored)
    _, reconciler = parts(agent)
    api.fail_next("GET", r"/pods/late", 500)
    await reconciler.once()
    assert await user_conflicts(agent) == []
    await reconciler.once()
    assert len(await user_conflicts(agent)) == 1


async def test_a_prepare_whose_pod_cannot_be_read_fails_with_why(
    agent: App, api: FakeApiServer
) -> None:
    stored = api.put_object(
        "resourceclaims", reserved_for(api, allocated_claim(NODE, [plain_result(NODE)]), 1000)
    )
    assert agent.dra is not None
    ref = ClaimRef("default", stored["metadata"]["name"], stored["metadata"]["uid"])
    api.fail_next("GET", r"/pods/", 500)
    [answer] = (await agent.dra.driver.prepare([ref])).values()
    assert answer.error.startswith("cannot read pod default/"), answer.error
    [again] = (await agent.dra.driver.prepare([ref])).values()
    assert not again.error
    [lease] = await leases(agent)
    assert lease.run_as_uid == 1000


# -- end to end -----------------------------------------------------------------------


def refusals(cluster: Any, pod: str) -> list[str]:
    return [m for p, m in cluster.scheduler.failures if p == f"default/{pod}"]


async def test_two_users_land_on_two_gpus_one_user_shares_one(root: Path) -> None:
    async with dra_cluster(root, nodes=1) as cluster:  # the simulated node's GPUs
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("quarter", memory="20Gi", threads="25"))
        for name, uid in (("a1", 1000), ("b", 2000), ("a2", 1000)):
            await cluster.apply(claim_pod(name, "quarter", run_as_user=uid))
            await running(cluster, name)
        by_pod = {x.pod: x for x in await node.leases()}
        assert {p: x.run_as_uid for p, x in by_pod.items()} == {
            "default/a1": 1000,
            "default/b": 2000,
            "default/a2": 1000,
        }
        devices_of: dict[str, set[int]] = {}
        for x in by_pod.values():
            devices_of.setdefault(x.device_uuid, set()).add(x.run_as_uid)
        assert all(len(uids) == 1 for uids in devices_of.values())  # one user a GPU
        assert by_pod["default/b"].device_uuid != by_pod["default/a1"].device_uuid


async def test_on_one_gpu_another_user_waits_with_its_reason_and_runs_after(root: Path) -> None:
    node_file = one_gpu_node(root)
    settings = {"sim.node_file": node_file, "dra.refusal_backoff_s": 1}
    async with dra_cluster(root, nodes=1, settings=settings) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("quarter", memory="20Gi", threads="25"))
        await cluster.apply(claim_pod("first", "quarter", run_as_user=1000))
        await running(cluster, "first")
        await cluster.apply(claim_pod("other", "quarter", run_as_user=2000))
        await cluster.apply(claim_pod("same", "quarter", run_as_user=1000))
        await running(cluster, "same")  # one user's shares run side by side
        await eventually(lambda: any("USER_CONFLICT" in m for m in refusals(cluster, "other")))
        await asyncio.sleep(1.5)  # it keeps waiting while the first user's pods run
        assert ("default", "other") not in cluster.running.containers
        assert {x.run_as_uid for x in await node.leases()} == {1000}
        for name in ("first", "same"):
            cluster.api_server.delete_pod("default", name, force=True)
        await running(cluster, "other")
        [lease] = await node.leases()
        assert (lease.pod, lease.run_as_uid) == ("default/other", 2000)


async def test_a_pod_without_a_user_is_told_how_to_fix_it(root: Path) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("quarter", memory="20Gi", threads="25"))
        await cluster.apply(claim_pod("nouser", "quarter", run_as_user=None))
        await eventually(lambda: any(FIX in m for m in refusals(cluster, "nouser")))
        [message, *_] = [m for m in refusals(cluster, "nouser") if FIX in m]
        assert "reason=RUN_AS_USER_REQUIRED" in message
        assert "container nouser/main states no user" in message
        assert await node.leases() == []
