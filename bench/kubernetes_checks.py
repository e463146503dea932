"""What bench/kubernetes.py checks while pods run: the environment each container was
allocated against its pod's ask and lease, each agent's ledger against its devices and the
rules, and what shows of a pod bound but never started."""

from __future__ import annotations

from collections import Counter

from agent.admission.policy import Rules
from agent.api.proto import agent_pb2 as pb
from agent.legacy.cluster.annotations import LEASE_ANNOTATION
from bench.kubernetes_plan import NAMESPACE, PodPlan
from tests.kubeworld.cluster.device_plugin import (
    LoopbackCluster,
)


def injection_problem(plan: PodPlan, lease: str, env: dict[str, str]) -> str | None:
    """What a container's Allocate environment got wrong: another lease id than its pod's
    ``gpushare.io/lease`` annotation (or none), or another memory limit or thread percentage
    than the pod's own annotations."""
    expected = {
        "GPUSHARE_LEASE_ID": lease,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={plan.memory_gib * 1024}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(plan.threads),
    }
    for key, value in expected.items():
        if not lease or env.get(key) != value:
            return f"{plan.name}: {key}={env.get(key)!r}, pod says {value!r}"
    return None


def ledger_problems(name: str, node: pb.GetNodeResponse, rules: Rules) -> list[str]:
    """Devices of agent ``name`` whose committed memory plus a context overhead per lease
    and the reserve passed their memory, whose thread percentages passed the thread budget,
    or whose leases passed the client limit."""
    problems: list[str] = []
    memory = {d.uuid: d.memory_bytes for d in node.devices}
    summed: Counter[str] = Counter()
    for lease in node.leases:
        summed[lease.device_uuid] += lease.memory_bytes
    for entry in node.ledger:
        total = memory.get(entry.device_uuid, 0)
        used = (
            max(entry.memory_committed_bytes, summed[entry.device_uuid])
            + entry.leases * rules.context_overhead_bytes
            + rules.reserve_bytes
        )
        if entry.leases and used > total:
            problems.append(f"{name}/{entry.device_uuid}: memory {used}")
        if entry.threads_committed_pct > rules.thread_budget_pct + 1e-6:
            problems.append(f"{name}/{entry.device_uuid}: threads {entry.threads_committed_pct}")
        if entry.leases > rules.max_clients:
            problems.append(f"{name}/{entry.device_uuid}: {entry.leases}")
    return problems


def why_stuck(cluster: LoopbackCluster, plan: PodPlan) -> str:
    """What the API server and the kubelets show of a pod bound but never started."""
    pod = cluster.api_server.pod(NAMESPACE, plan.name) or {}
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    kubelets = cluster.kubelets
    seen = kubelets is not None and plan.uid in kubelets._seen
    got = kubelets.got.get((NAMESPACE, plan.name, "main")) if kubelets else None
    return (
        f"{plan.name}: node {spec.get('nodeName')!r}, lease "
        f"{(meta.get('annotations') or {}).get(LEASE_ANNOTATION)!r}, phase "
        f"{(pod.get('status') or {}).get('phase')!r}, seen by its kubelet {seen}, "
        f"allocation {getattr(got, 'failed_at', None)!r} {getattr(got, 'error', None)!r}"
    )


def evicted_event(cluster: LoopbackCluster, plan: PodPlan) -> bool:
    """Whether the pod has an event LeaseEvicted: the lease controller deleted it because
    its agent evicted its lease."""
    events = cluster.api_server.events_for(plan.name, NAMESPACE)
    return any(
        e.get("reason") == "LeaseEvicted" and e["involvedObject"].get("uid") == plan.uid
        for e in events
    )
