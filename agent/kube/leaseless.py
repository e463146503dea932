"""Pods bound with a lease that is no longer live on their node: the level-triggered side
of evictions. The lease controller deletes a pod whose lease its agent evicted when the
``lease.evicted`` event comes; an eviction while ``kube serve`` was down (or an event it
missed) leaves the pod bound to a lease that is gone, unable to start a container. The
reconcile finds such pods here and deletes them the same way.

A pod counts once its lease is missing from two answers of its node's agent: the one that
first lacked it and a newer one, at least ``grace_s`` later. A bind under way is never
such a pod: its lease is pending in the cache from the Admit until an answer shows it.
Nodes whose agent is unknown, or whose last answer failed, are left alone."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.kube.annotations import SCHEDULER_NAME
from agent.kube.cache import NodeEntry
from agent.kube.port import Obj, annotations_of, ended
from agent.kubelet.port import LEASE_ANNOTATION


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
        self._handed: set[str] = set()  # pods already handed out for deletion

    def due(
        self, pods: Iterable[Obj], nodes: Mapping[str, NodeEntry], now: float
    ) -> list[Leaseless]:
        """The pods to delete now (each once)."""
        found, seen = [], set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            node, lease_id = _placement(pod)
            entry = nodes.get(node)
            if not lease_id or entry is None or _live(entry, lease_id) or ended(pod):
                continue
            if entry.snapshot is None or entry.stale or entry.link is None:
                continue
            seen.add(uid)
            first_at, first_answer = self._since.setdefault(uid, (now, entry.snapshot))
            newer = entry.snapshot is not first_answer
            if newer and now - first_at >= self._grace_s and uid not in self._handed:
                self._handed.add(uid)
                found.append(Leaseless(pod, node, f"lease {lease_id} is no longer live there"))
        self._since = {uid: since for uid, since in self._since.items() if uid in seen}
        self._handed &= seen
        return found


def _placement(pod: Obj) -> tuple[str, str]:
    return (pod.get("spec") or {}).get("nodeName", ""), annotations_of(pod).get(
        LEASE_ANNOTATION, ""
    )


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
