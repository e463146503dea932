"""The extender's prioritize: best-fit over the idle nodes, and a node with a bind under
way below every idle node that fits (its binds go one at a time)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from agent.admission.policy import Rules
from agent.api.proto import agent_pb2 as pb
from agent.core.units import GIB
from agent.kube.agents import AgentLink
from agent.kube.binder import Binder
from agent.kube.cache import AgentCache, NodeEntry
from agent.kube.extender import Extender
from agent.kube.views import lease_of


def node(used_gib: int) -> pb.GetNodeResponse:
    uuid = "GPU-00000000-0000-0000-0000-000000000001"
    leases = [
        pb.Lease(
            lease_id="l-1", request_id="r-1", tenant="team", trust_domain="team", device_uuid=uuid,
            priority="burstable", memory_bytes=used_gib * GIB, thread_pct=10,
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
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"gpushare.io/share": 1}}}]},
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
    assert all(got[n] == 0 for n in queued)
    assert all(got[n] >= 1 for n in used_gib if n not in queued)  # idle and fits: above busy


def test_when_every_node_is_busy_they_tie() -> None:
    ext = extender({"a": 0, "b": 70})
    ext.binder.queued.update({"a": 1, "b": 2})
    assert scores(ext, ["a", "b"]) == {"a": 0, "b": 0}


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
    import agent.kube.extender as module

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
    lease = pb.Lease(
        lease_id="l-9",
        request_id="r-9",
        device_uuid="x",
        memory_bytes=GIB,
        priority="burstable",
        state="admitted",
    )
    ext.cache.add_pending("a", lease_of(lease))  # a bind in flight: a's views change
    scores(ext, ["a", "b"])
    assert len(decided) == 3, "a changed node is decided again"
