"""The extender's prioritize: best-fit over the idle nodes, and a node with a bind under
way below every idle node that fits (its binds go one at a time)."""

from __future__ import annotations

import time
from typing import Any, cast

import pytest

from agent.admission.policy import Rules
from agent.api.proto import agent_pb2 as pb
from agent.core.units import GIB
from agent.legacy.cluster.agents import AgentLink
from agent.legacy.cluster.binder import Binder
from agent.legacy.cluster.cache import ASSUMED_S, AgentCache, NodeEntry
from agent.legacy.cluster.extender import Extender
from agent.legacy.cluster.views import lease_of


def node(used_gib: int, priority: str = "burstable") -> pb.GetNodeResponse:
    uuid = "GPU-00000000-0000-0000-0000-000000000001"
    leases = [
        pb.Lease(
            lease_id="l-1", request_id="r-1", tenant="team", trust_domain="team", device_uuid=uuid,
            priority=priority, memory_bytes=used_gib * GIB, thread_pct=10,
            state="admitted", created_at=1.0, updated_at=1.0,
        )
    ] if used_gib else []  # fmt: skip
    return pb.GetNodeResponse(
        devices=[pb.Device(uuid=uuid, model="H100", memory_bytes=80 * GIB, sharing_mode="mps")],
        leases=leases,
    )


def extender(used_gib: dict[str, int]) -> Extender:
    cache = AgentCache(cast(Any, None))
    for name, used in used_gib.items():
        cache.nodes[name] = NodeEntry(
            name, f"{name}:9807", link=cast(AgentLink, object()), snapshot=node(used), error=""
        )
    return Extender(cache, Binder(cast(Any, None), cache), Rules())


def pod() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "team",
            "uid": "u-1",
            "annotations": {"gpushare.io/memory": "4Gi", "gpushare.io/threads": "10"},
        },
        "spec": {
            "securityContext": {"runAsUser": 1000},
            "containers": [{"name": "c", "resources": {"limits": {"gpushare.io/share": 1}}}],
        },
    }


def scores(ext: Extender, names: list[str]) -> dict[str, int]:
    answer = ext.prioritize({"pod": pod(), "nodenames": names})
    return {x["Host"]: x["Score"] for x in answer}


@pytest.mark.parametrize(
    ("used_gib", "queued", "best"),
    [
        ({"empty": 0, "half": 40, "full": 70}, {}, "full"),  # best-fit when all are idle
        ({"empty": 0, "half": 40, "full": 70}, {"full": 1}, "half"),  # busy: below idle
        ({"empty": 0, "half": 40, "full": 70}, {"full": 1, "half": 3}, "empty"),
    ],
)
def test_best_fit_among_idle_nodes(
    used_gib: dict[str, int], queued: dict[str, int], best: str
) -> None:
    ext = extender(used_gib)
    ext.binder.queued.update(queued)
    got = scores(ext, list(used_gib))
    assert max(got, key=lambda n: got[n]) == best
    assert all(got[n] == 1 for n in queued)
    assert all(got[n] >= 2 for n in used_gib if n not in queued)  # idle and fits: above busy


def test_when_every_node_is_busy_they_tie() -> None:
    ext = extender({"a": 0, "b": 70})
    ext.binder.queued.update({"a": 1, "b": 2})
    assert scores(ext, ["a", "b"]) == {"a": 1, "b": 1}


def test_a_node_that_fits_only_by_preempting_scores_below_busy_and_idle_ones() -> None:
    """A guaranteed pod that fits on a full node by evicting a best-effort lease: that node
    would be the fullest (best-fit's favourite), but an eviction ends another pod."""
    ext = extender({"full": 78, "busy": 40, "idle": 0})
    ext.cache.nodes["full"].snapshot = node(78, "best-effort")
    ext.binder.queued.update({"busy": 1})
    guaranteed = pod()
    guaranteed["metadata"]["annotations"]["gpushare.io/priority"] = "guaranteed"
    decided, _ = ext.decisions(guaranteed, ["full"])
    assert decided["full"].preempted_lease_ids == ("l-1",)  # it does fit there, by eviction
    answer = ext.prioritize({"pod": guaranteed, "nodenames": ["full", "busy", "idle"]})
    got = {x["Host"]: x["Score"] for x in answer}
    assert got["full"] == 0 and got["busy"] == 1 and got["idle"] >= 2


def test_the_views_follow_the_binds_in_flight_and_each_answer() -> None:
    """The views are built once per answer, and again whenever a bind in flight is added
    or dropped: a pod filtered right after a grant counts that grant."""
    ext = extender({"a": 0})
    cache = ext.cache
    assert cache.views("a") is cache.views("a")  # the same answer: built once
    assert [len(v.leases) for v in cache.views("a") or []] == [0]
    granted = node(8).leases[0]
    cache.add_pending("a", lease_of(granted))
    assert [v.memory_committed_bytes for v in cache.views("a") or []] == [8 * GIB]
    cache.drop_pending("a", granted.lease_id)
    assert [len(v.leases) for v in cache.views("a") or []] == [0]
    cache.nodes["a"].snapshot = node(40)  # a new answer
    assert [v.memory_committed_bytes for v in cache.views("a") or []] == [40 * GIB]


def test_a_pods_prioritize_reuses_its_filters_decisions_until_the_node_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agent.legacy.cluster.extender as module

    decided: list[str] = []
    real = module.decide

    def counting(request: Any, views: Any, rules: Any, **kw: Any) -> Any:
        decided.append(request.request_id)
        return real(request, views, rules, **kw)

    monkeypatch.setattr(module, "decide", counting)
    ext = extender({"a": 0, "b": 40})
    assert ext.filter({"pod": pod(), "nodenames": ["a", "b"]})["nodenames"] == ["a", "b"]
    scores(ext, ["a", "b"])
    assert len(decided) == 2, "prioritize decided again on the same views"
    a_bind = a_lease("l-9", "r-9", "admitted")
    ext.cache.add_pending("a", a_bind)  # a bind in flight: a's views change
    scores(ext, ["a", "b"])
    # a changed, and b holds the pod's own placement, assumed by the first prioritize
    assert len(decided) == 4, "a changed node is decided again"


def test_the_one_best_node_holds_the_pods_lease_until_its_bind() -> None:
    """Pods prioritized at the same moment: the first one's expected placement counts on
    the best-fit node, so the next does not count on the same free memory."""
    ext = extender({"a": 0, "b": 70})
    first, second = pod(), pod()
    second["metadata"]["uid"] = "u-2"
    for each in (first, second):
        each["metadata"]["annotations"]["gpushare.io/memory"] = "6Gi"
    got = scores_of(ext, first, ["a", "b"])
    assert got["b"] > got["a"]  # b: the fullest that fits
    # b had 80 - 70 - 1 (reserve) - 0.5 x 2 (contexts) = 8 GiB left; 6 of them are assumed
    assert ext.filter({"pod": second, "nodenames": ["a", "b"]})["nodenames"] == ["a"]
    ext.cache.expire_assumed(time.monotonic() + ASSUMED_S)  # its bind never came
    assert ext.filter({"pod": second, "nodenames": ["a", "b"]})["nodenames"] == ["a", "b"]


def test_a_tie_assumes_nothing() -> None:
    ext = extender({"a": 0, "b": 0})
    scores(ext, ["a", "b"])
    assert all(not entry.pending for entry in ext.cache.nodes.values())


def scores_of(ext: Extender, the_pod: dict[str, Any], names: list[str]) -> dict[str, int]:
    answer = ext.prioritize({"pod": the_pod, "nodenames": names})
    return {x["Host"]: x["Score"] for x in answer}


def test_filter_expires_assumptions_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler skips prioritize when one node passes filter: a pod that never binds
    must not hold its assumed lease past ASSUMED_S because no prioritize came."""
    ext = extender({"a": 0, "b": 70})
    scores_of(ext, pod(), ["a", "b"])
    assert ext.cache.nodes["b"].pending  # assumed on b
    later = time.monotonic() + ASSUMED_S + 1
    monkeypatch.setattr(time, "monotonic", lambda: later)
    other = pod()
    other["metadata"]["uid"] = "u-9"
    ext.filter({"pod": other, "nodenames": ["a"]})
    assert not ext.cache.nodes["b"].pending


def test_a_bind_keeps_its_assumption_while_it_waits_and_drops_one_elsewhere() -> None:
    ext = extender({"a": 0, "b": 70})
    cache = ext.cache
    scores_of(ext, pod(), ["a", "b"])  # assumed on b
    cache.keep_assumed("u-1", "b")  # its bind began on b: waits in b's line
    cache.expire_assumed(time.monotonic() + 10 * ASSUMED_S)
    assert "assumed-u-1" in cache.nodes["b"].pending
    cache.keep_assumed("u-1", "a")  # a bind of it on another node: b's assumption goes
    assert not cache.nodes["b"].pending


def test_a_late_bind_leaves_the_next_tries_assumption_alone() -> None:
    """The scheduler gave up waiting for a bind and tried the pod again: its new
    assumption (on the same node, or another) stays when the old bind ends at last."""
    ext = extender({"a": 70, "b": 70})
    cache = ext.cache
    for retry_node in ("b", "a"):
        cache.assume("b", assumed_lease(), until=time.monotonic() + ASSUMED_S)
        kept = cache.keep_assumed("u-1", "b")  # the first bind, on b
        assert kept is not None
        cache.assume(retry_node, assumed_lease(), until=time.monotonic() + ASSUMED_S)
        cache.forget_assumed("u-1", only=kept)  # the first bind ends
        assert "assumed-u-1" in cache.nodes[retry_node].pending
        cache.forget_assumed("u-1")
        assert not any(entry.pending for entry in cache.nodes.values())


def assumed_lease() -> Any:
    return a_lease("assumed-u-1", "u-1", "reserved")


def a_lease(lease_id: str, request_id: str, state: str) -> Any:
    """A 1 GiB burstable lease on device x."""
    return lease_of(
        pb.Lease(
            lease_id=lease_id,
            request_id=request_id,
            device_uuid="x",
            memory_bytes=GIB,
            priority="burstable",
            state=state,
        )
    )
