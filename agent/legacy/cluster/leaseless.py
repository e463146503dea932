"""Pods bound with a lease that is no longer live on their node and no container
running: the level-triggered side of evictions. The lease controller deletes a pod whose
lease its agent evicted when the ``lease.evicted`` event comes; an eviction while ``kube
serve`` was down (or an event it missed) leaves the pod bound to a lease that is gone,
unable to start a container (the device plugin and the NRI plugin refuse it). The reconcile
finds such pods here and deletes them the same way.

A pod counts once its lease is missing from two answers of its node's agent: the one that
first lacked it and a newer one, at least ``grace_s`` later. A pod with a container running
never counts: its lease may have ended by design (the janitor releases a lease whose
processes have all exited) while the container goes on. A bind under way never counts
either: its lease is pending in the cache from the Admit until an answer shows it. Nodes
whose agent is unknown, whose last answer failed, or whose answer hides leases from this
caller (another identity's: it cannot tell a missing lease from a hidden one) are left
alone. A pod handed out for deletion is handed out again after twice the grace if it is
still there (its deletion gave up)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.api.proto import agent_pb2 as pb
from agent.kubeapi.port import Obj, annotations_of, ended
from agent.legacy.cluster.annotations import SCHEDULER_NAME
from agent.legacy.cluster.cache import NodeEntry
from agent.legacy.podleases import LEASE_ANNOTATION


@dataclass(frozen=True)
class Leaseless:
    pod: Obj
    node: str
    why: str


class LeaselessPods:
    def __init__(self, grace_s: float) -> None:
        self._grace_s = grace_s
        # pod uid -> (when first seen without its lease, the answer that lacked it)
        self._since: dict[str, tuple[float, object]] = {}
        self._handed: dict[str, float] = {}  # pod uid -> when handed out for deletion

    def due(
        self, pods: Iterable[Obj], nodes: Mapping[str, NodeEntry], now: float
    ) -> list[Leaseless]:
        """The pods to delete now."""
        found, seen = [], set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            node, lease_id = placement(pod)
            entry = nodes.get(node)
            if not lease_id or entry is None or not _judged(entry) or _running(pod):
                continue
            if _live(entry, lease_id) or ended(pod):
                continue
            seen.add(uid)
            first_at, first_answer = self._since.setdefault(uid, (now, entry.snapshot))
            newer = entry.snapshot is not first_answer
            handed_at = self._handed.get(uid)
            again = handed_at is None or now - handed_at >= 2 * self._grace_s
            if newer and now - first_at >= self._grace_s and again:
                self._handed[uid] = now
                found.append(Leaseless(pod, node, f"lease {lease_id} is no longer live there"))
        self._since = {uid: since for uid, since in self._since.items() if uid in seen}
        self._handed = {uid: at for uid, at in self._handed.items() if uid in seen}
        return found


def placement(pod: Obj) -> tuple[str, str]:
    """The node a pod is bound to ("" for none) and the lease it was bound with."""
    node = (pod.get("spec") or {}).get("nodeName", "")
    return node, annotations_of(pod).get(LEASE_ANNOTATION, "")


def _judged(entry: NodeEntry) -> bool:
    """The agent answered lately, and its answer shows every lease to this caller."""
    snapshot = entry.snapshot
    if snapshot is None or entry.stale or entry.link is None:
        return False
    return all(x.lease_id for x in snapshot.leases)


def _running(pod: Obj) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any("running" in (x.get("state") or {}) for x in statuses)


def _live(entry: NodeEntry, lease_id: str) -> bool:
    """Live in the agent's last answer, or granted to a bind whose answer is yet to come."""
    if lease_id in entry.pending:
        return True
    return entry.snapshot is not None and any(x.lease_id == lease_id for x in entry.snapshot.leases)


def evicted_event(pod: Obj, message: str) -> Obj:
    meta = pod["metadata"]
    return {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        },
        "reason": "LeaseEvicted",
        "message": message,
        "type": "Warning",
        "source": {"component": SCHEDULER_NAME},
    }


def orphaned(lease: pb.Lease, node: str, where_bound: tuple[str, str] | None) -> str:
    """Why this pod lease on ``node`` is no longer its pod's, or "" if it still is. The
    pod's lease annotation only chooses among the pod's own leases (a user who points it
    at another pod's lease changes nothing for that lease)."""
    if where_bound is None:
        return "is gone or ended"
    where, bound_with = where_bound
    if where == "":
        return ""  # a bind died half way: the pod's retry takes this lease back
    if where != node:
        return f"is bound to {where}"
    if bound_with and bound_with != lease.lease_id:
        return f"was bound with lease {bound_with}"
    return ""
