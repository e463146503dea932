"""The share's user on the extender path: the extender decides with the pod's UID (its
``runAsUser``) and refuses a share pod that does not state one, the binder sends it to the
agent, and on a cluster on loopback (tests/kubeworld/cluster/, real agents) two pods of
different users never share one GPU's MPS server at once, while two of one user do."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from agent.admission.policy import Rules
from agent.api.proto import agent_pb2 as pb
from agent.core.podusers import FIX
from agent.core.units import GIB
from agent.legacy.cluster.agents import AgentLink
from agent.legacy.cluster.annotations import parse_ask
from agent.legacy.cluster.binder import Binder
from agent.legacy.cluster.cache import AgentCache, NodeEntry
from agent.legacy.cluster.extender import Extender, admission_of
from tests.kubeworld.cluster.device_plugin import (
    LoopbackCluster,
    Refused,
    eventually,
    gpu_pod,
    loopback_cluster,
)
from tests.kubeworld.scheduler.extender import SchedulerStandIn

UUID = "GPU-00000000-0000-0000-0000-000000000001"
NOT_STATED = (
    "spec.containers[0].securityContext.runAsUser: the GPU share's user is not stated: " + FIX
)

# -- the extender, on cached nodes -----------------------------------------------------------


def node(*lease_uids: int | None) -> pb.GetNodeResponse:
    """One MPS device with a 4 GiB lease of team-a per UID given (None: a lease made before
    UIDs were recorded)."""
    leases = [
        pb.Lease(
            lease_id=f"l-{i}", request_id=f"r-{i}", tenant="team-a", trust_domain="team-a",
            device_uuid=UUID, priority="burstable", memory_bytes=4 * GIB, thread_pct=10,
            state="admitted", created_at=1.0, updated_at=1.0, run_as_uid=uid,
        )
        for i, uid in enumerate(lease_uids)
    ]  # fmt: skip
    device = pb.Device(uuid=UUID, model="H100", memory_bytes=80 * GIB, sharing_mode="mps")
    return pb.GetNodeResponse(devices=[device], leases=leases)


def extender(nodes: dict[str, pb.GetNodeResponse], *, require_user: bool = True) -> Extender:
    cache = AgentCache(cast(Any, None))
    for name, answer in nodes.items():
        link = cast(AgentLink, object())
        cache.nodes[name] = NodeEntry(name, f"{name}:9807", link=link, snapshot=answer, error="")
    binder = Binder(cast(Any, None), cache, require_user=require_user)
    return Extender(cache, binder, Rules(), require_user=require_user)


def share_pod(run_as_user: int | None, uid: str = "u-1") -> dict[str, Any]:
    pod = gpu_pod("train", run_as_user=run_as_user)
    pod["metadata"]["uid"] = uid
    return pod


@pytest.mark.parametrize(("run_as_user", "expected"), [(1000, 1000), (0, 0), (None, None)])
def test_the_decision_carries_the_pods_uid(run_as_user: int | None, expected: int | None) -> None:
    assert admission_of(parse_ask(share_pod(run_as_user))).run_as_uid == expected


def test_a_share_pod_without_a_user_fails_every_node_saying_how_to_fix_it() -> None:
    ext = extender({"a": node(), "b": node(1000)})
    answer = ext.filter({"pod": share_pod(None), "nodenames": ["a", "b"]})
    assert answer == {
        "nodenames": [],
        "failedAndUnresolvableNodes": {"a": NOT_STATED, "b": NOT_STATED},
    }
    scores = ext.prioritize({"pod": share_pod(None), "nodenames": ["a", "b"]})
    assert scores == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 0}]
    assert all(not entry.pending for entry in ext.cache.nodes.values())  # nothing assumed


# the device's leases' UIDs -> whether a pod of UID 2000 may join (its MPS server's user)
DEVICES: list[tuple[str, tuple[int | None, ...], bool]] = [
    ("free", (), True),
    ("of its own user", (2000,), True),
    ("of another user", (1000,), False),
    ("of its own and a UID-less lease", (2000, None), True),
    ("UID-less leases only (made before UIDs)", (None, None), True),
    ("another user beside UID-less leases", (None, 1000), False),
]


@pytest.mark.parametrize(("uids", "joins"), [d[1:] for d in DEVICES], ids=[d[0] for d in DEVICES])
def test_the_filter_keeps_one_user_per_device(uids: tuple[int | None, ...], joins: bool) -> None:
    ext = extender({"n": node(*uids)})
    answer = ext.filter({"pod": share_pod(2000), "nodenames": ["n"]})
    if joins:
        assert answer == {"nodenames": ["n"], "failedNodes": {}}
        return
    assert answer["nodenames"] == []
    assert answer["failedNodes"]["n"].startswith(
        f"USER_CONFLICT: no device fits: {UUID}: device's MPS server runs as UID 1000; "
        "a client of UID 2000 would wait in CUDA initialisation"
    )


def test_a_pods_decision_is_remembered_with_its_uid() -> None:
    """The memo keys on the whole request: the same request id with another UID is
    decided again, not answered from the first decision."""
    ext = extender({"n": node(1000)})
    assert ext.filter({"pod": share_pod(1000), "nodenames": ["n"]})["nodenames"] == ["n"]
    assert ext.filter({"pod": share_pod(2000), "nodenames": ["n"]})["nodenames"] == []


def test_the_lease_assumed_at_prioritize_holds_its_user() -> None:
    """A pod prioritized onto the one best node counts there as its user until its bind:
    a pod of another user decided meanwhile goes elsewhere."""
    ext = extender({"busy": node(1000), "free": node()})
    first = share_pod(1000)
    ext.prioritize({"pod": first, "nodenames": ["busy", "free"]})
    [assumed] = ext.cache.nodes["busy"].pending.values()  # the fuller node: best fit
    assert assumed.run_as_uid == 1000
    other = ext.filter({"pod": share_pod(3000, uid="u-2"), "nodenames": ["busy", "free"]})
    assert other["nodenames"] == ["free"]
    ext.cache.expire_assumed(time.monotonic() + 60)


def test_with_the_user_optional_the_agents_judge_it() -> None:
    """``--run-as-user optional`` (multi-user MPS daemons): a pod that does not say passes,
    and the filter leaves the one-user rule to the node's agent, which knows whether its
    daemons run multi-user."""
    ext = extender({"n": node(1000)}, require_user=False)
    assert ext.filter({"pod": share_pod(None), "nodenames": ["n"]})["nodenames"] == ["n"]
    assert ext.filter({"pod": share_pod(2000), "nodenames": ["n"]})["nodenames"] == ["n"]
    ext.prioritize({"pod": share_pod(2000), "nodenames": ["n"]})
    [assumed] = ext.cache.nodes["n"].pending.values()
    assert assumed.run_as_uid == 2000  # still sent: recorded with the lease


# -- gpushare kube serve --run-as-user ------------------------------------------------------


@pytest.mark.parametrize(("args", "required"), [((), True), (("--run-as-user", "optional"), False)])
def test_kube_serve_takes_the_requirement(
    monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], required: bool
) -> None:
    import agent.cli.kube as cli
    import agent.cli.logs as logs

    seen: list[Any] = []

    async def nothing() -> None:
        return None

    def serve(_options: Any, cluster: Any) -> Any:
        seen.append(cluster)
        return nothing()

    monkeypatch.setattr(cli, "_serve", serve)
    monkeypatch.setattr(cli, "serve_until_stopped", lambda main: main.close())
    monkeypatch.setattr(logs, "setup_logging", lambda **_: None)
    done = CliRunner().invoke(cli.kube, ["serve", "--no-leader-elect", "--insecure-agents", *args])
    assert done.exit_code == 0, done.output
    [cluster] = seen
    assert cluster.require_run_as_user is required


def test_kube_serve_says_what_the_requirement_is() -> None:
    import agent.cli.kube as cli

    done = CliRunner().invoke(cli.kube, ["serve", "--help"], terminal_width=200)
    assert "--run-as-user [required|optional]" in done.output
    assert "mps.multi_user" in done.output and "[default: required]" in done.output
    assert CliRunner().invoke(cli.kube, ["serve", "--run-as-user", "maybe"]).exit_code == 2


# -- on a cluster on loopback ----------------------------------------------------------------

pytestmark = pytest.mark.timeout(180)


def one_gpu_node(root: Path) -> Path:
    path = root / "node.yaml"
    path.write_text("version: 1\ndevices:\n  - model: H100-SXM5-80GB\n    memory: 80GiB\n")
    return path


@pytest.fixture
async def cluster(root: Path) -> AsyncIterator[LoopbackCluster]:
    """One node with one GPU."""
    simulated = ("--set", f"sim.node_file={one_gpu_node(root)}")
    async with loopback_cluster(root, nodes=1, agent_args=simulated) as (c, scheduler):
        assert isinstance(scheduler, SchedulerStandIn)
        yield c


def running(c: LoopbackCluster, name: str) -> bool:
    pod = c.api_server.pod("team-a", name)
    return pod is not None and pod["status"].get("phase") == "Running"


async def lease_users(c: LoopbackCluster) -> dict[str, tuple[str, int | None]]:
    """pod -> (its lease's device, its lease's UID) on the one node."""
    return {
        x.pod: (x.device_uuid, x.run_as_uid if x.HasField("run_as_uid") else None)
        for x in await c.leases("gpu-node-0")
        if x.pod
    }


async def test_a_pod_of_another_user_waits_until_the_first_ends(cluster: LoopbackCluster) -> None:
    c = cluster
    await c.apply(gpu_pod("first", memory="4Gi", run_as_user=1000))
    await eventually(lambda: running(c, "first"))
    await c.apply(gpu_pod("second", memory="4Gi", run_as_user=2000))  # both would fit

    def refused_for_its_user() -> bool:
        return any("USER_CONFLICT" in e["message"] for e in c.api_server.events_for("second"))

    await eventually(refused_for_its_user, 30)
    [event, *_] = [e for e in c.api_server.events_for("second") if "USER_CONFLICT" in e["message"]]
    assert event["message"].startswith("0/1 nodes are available: 1 USER_CONFLICT: no device fits")
    assert "device's MPS server runs as UID 1000" in event["message"]  # the filter's word
    second = c.api_server.pod("team-a", "second")
    assert second is not None and not second["spec"].get("nodeName")
    assert {pod: uid for pod, (_, uid) in (await lease_users(c)).items()} == {"team-a/first": 1000}

    c.api_server.delete_pod("team-a", "first")
    await eventually(lambda: running(c, "second"), 30)
    assert {pod: uid for pod, (_, uid) in (await lease_users(c)).items()} == {"team-a/second": 2000}


async def test_pods_of_one_user_share_the_gpu(cluster: LoopbackCluster) -> None:
    c = cluster
    for name in ("first", "second"):
        await c.apply(gpu_pod(name, memory="4Gi", run_as_user=1000))
    await eventually(lambda: running(c, "first") and running(c, "second"))
    users = await lease_users(c)
    assert set(users) == {"team-a/first", "team-a/second"}
    assert len({device for device, _ in users.values()}) == 1  # the one GPU
    assert {uid for _, uid in users.values()} == {1000}


async def test_a_pod_without_a_user_is_refused_at_apply_filter_and_bind(
    cluster: LoopbackCluster,
) -> None:
    """The webhook refuses it; created without the webhook, the filter fails the node
    with how to fix it, and a bind asked anyway admits nothing."""
    c = cluster
    with pytest.raises(Refused, match=r"spec\.containers\[0\]\.securityContext\.runAsUser"):
        await c.apply(gpu_pod("nobody", run_as_user=None))
    assert c.api_server.pod("team-a", "nobody") is None

    created = await c.api_server_create(gpu_pod("nobody", run_as_user=None))

    def said_how_to_fix() -> bool:
        return any(NOT_STATED in e["message"] for e in c.api_server.events_for("nobody"))

    await eventually(said_how_to_fix, 30)
    assert c.side is not None
    meta = created["metadata"]
    error = await c.side.binder.bind(meta["namespace"], meta["name"], meta["uid"], "gpu-node-0")
    assert error == NOT_STATED
    pod = c.api_server.pod("team-a", "nobody")
    assert pod is not None and not pod["spec"].get("nodeName")
    assert await lease_users(c) == {}


async def test_a_gangs_reservations_carry_the_user(cluster: LoopbackCluster) -> None:
    """Gang members are reserved (``Reserve``), then committed: with their UID."""
    c = cluster
    for i in range(2):
        await c.apply(gpu_pod(f"worker-{i}", gang="job", gang_size=2, run_as_user=1000))
    await eventually(lambda: running(c, "worker-0") and running(c, "worker-1"), 60)
    users = await lease_users(c)
    assert {pod: uid for pod, (_, uid) in users.items()} == {
        "team-a/worker-0": 1000,
        "team-a/worker-1": 1000,
    }
