"""Experiment 2: node-local fractional replay of the openb pods over time.

The GPU pods of ``openb_pod_list_default.csv`` arrive at ``creation_time`` and leave at
``deletion_time`` on the GPU nodes of ``openb_node_list_gpu_node.csv``. Each node decides
with the agent's own admission policy (``agent.admission.policy.decide``) over its devices:
a pod's ``gpu_milli`` becomes its thread percentage (``gpu_milli / 10``), QoS ``LS`` the
protected class (``guaranteed``), ``BE`` best-effort, other classes burstable; its memory is
the same share of the device's memory (``gpu_milli / 1000`` of it; the trace has no GPU
memory). A pod of n whole GPUs is n leases on one node, all or nothing. Node-local rules:
no reserve, no context overhead, thread budget 100% (the trace's GPU shares never
oversubscribe), preemption off. Among nodes, the one the same rule prefers by free
capacity is asked first. A pod that fits nowhere waits (skip-ahead FIFO) until room frees
or its deletion time passes.

Stranded capacity is the agent's own figure (free memory and threads no standard size can
use; standard sizes: the trace's common shares 320, 470, 650, 810 milli and a whole GPU),
and fragmentation the share of free GPU capacity that sits on partly used GPUs, both
averaged over samples every 250 events.
"""

from __future__ import annotations

import csv
import heapq
from pathlib import Path
from typing import Any

import numpy as np

from agent.admission.capacity import StandardSize, stranded
from agent.admission.policy import DeviceView, Placement, Rules, decide
from agent.core.lease import Lease, LeaseState
from agent.core.types import AdmissionRequest, Device, PriorityClass
from agent.core.units import GIB
from bench.replays.common import openb_gpu_nodes, plot, write_table

# The trace names models, not memory: public sizes; G1-G3 are undisclosed (assumed 32 GiB).
MEMORY_GIB = {"T4": 16, "P100": 16, "V100M16": 16, "V100M32": 32, "A10": 24}
QOS = {"LS": PriorityClass.GUARANTEED, "BE": PriorityClass.BEST_EFFORT}
SHARES = (320, 470, 650, 810, 1000)


def pods(openb: Path, speedup: float = 1.0) -> list[dict[str, Any]]:
    """GPU pods by creation time; with ``speedup`` k, arrivals come k times as densely
    (creation times divided by k) while each pod keeps its lifetime: k times the load."""
    with open(openb / "openb_pod_list_default.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["num_gpu"]) > 0 and r["creation_time"]]
    return sorted(
        (
            {
                "name": r["name"],
                "gpus": int(r["num_gpu"]),
                "milli": int(r["gpu_milli"]),
                "qos": r["qos"],
                "start": float(r["creation_time"]) / speedup,
                "end": float(r["creation_time"]) / speedup
                + float(r["deletion_time"] or r["creation_time"])
                - float(r["creation_time"]),
            }
            for r in rows
        ),
        key=lambda p: p["start"],
    )


class Node:
    def __init__(self, index: int, gpus: int, model: str, rule: Placement) -> None:
        memory = MEMORY_GIB.get(model, 32) * GIB
        self.devices = [Device(f"n{index}-g{g}", g, model, memory) for g in range(gpus)]
        self.leases: dict[str, list[Lease]] = {d.uuid: [] for d in self.devices}
        self.rules = Rules(
            reserve_bytes=0,
            context_overhead_bytes=0,
            thread_budget_pct=100.0,
            guaranteed_budget_pct=100.0,
            placement=rule,
        )

    def views(self, exclude: set[str] | None = None) -> list[DeviceView]:
        exclude = exclude or set()
        return [
            DeviceView(d, tuple(self.leases[d.uuid])) for d in self.devices if d.uuid not in exclude
        ]

    def free_milli(self) -> list[int]:
        return [
            1000 - round(sum(x.thread_pct for x in self.leases[d.uuid]) * 10) for d in self.devices
        ]

    def admit(self, pod: dict[str, Any], now: float) -> list[Lease] | None:
        """All of the pod's leases on this node, or none."""
        taken: list[Lease] = []
        used: set[str] = set()
        for n in range(pod["gpus"]):
            memory = self.devices[0].memory_bytes * pod["milli"] // 1000
            request = AdmissionRequest(
                f"{pod['name']}-{n}",
                "openb",
                "openb",
                QOS.get(pod["qos"], PriorityClass.BURSTABLE),
                max(memory, 2**20),
                pod["milli"] / 10,
            )
            # a multi-GPU pod takes distinct devices: the ones it holds are not offered again
            decision = decide(
                request, self.views(used), self.rules, now=now, allow_preemption=False
            )
            if not decision.admitted or decision.device_uuid is None:
                for lease in taken:
                    self.leases[lease.device_uuid].remove(lease)
                return None
            lease = Lease(
                request.request_id,
                request.request_id,
                "openb",
                "openb",
                decision.device_uuid,
                request.priority,
                request.memory_bytes,
                request.thread_pct,
                LeaseState.READY,
                now,
                now,
            )
            self.leases[lease.device_uuid].append(lease)
            used.add(lease.device_uuid)
            taken.append(lease)
        return taken

    def release(self, leases: list[Lease]) -> None:
        for lease in leases:
            self.leases[lease.device_uuid].remove(lease)


def replay(openb: Path, rule: Placement, speedup: float, supply: float = 1.0) -> dict[str, Any]:
    every = openb_gpu_nodes(openb)
    kept = sorted(np.random.default_rng(0).permutation(len(every))[: round(supply * len(every))])
    nodes = [Node(i, every[k][1], every[k][2], rule) for i, k in enumerate(kept)]
    free = np.asarray([(n.free_milli() + [-1] * 8)[:8] for n in nodes], dtype=float)
    events: list[tuple[float, int, int]] = []  # (time, kind 0 = leave / 1 = arrive, pod)
    trace = pods(openb, speedup)
    for at, pod in enumerate(trace):
        heapq.heappush(events, (pod["start"], 1, at))
    placed: dict[int, tuple[int, list[Lease]]] = {}
    waiting: list[int] = []
    waits: list[float] = []
    samples: list[tuple[float, float]] = []
    sizes = [StandardSize(int(32 * GIB * s // 1000), s / 10) for s in SHARES]
    count = 0

    def try_place(at: int, now: float) -> bool:
        pod = trace[at]
        if pod["gpus"] == 1:
            fits = (free >= pod["milli"]).any(axis=1)
        else:
            fits = (free == 1000).sum(axis=1) >= pod["gpus"]
        candidates = np.nonzero(fits)[0]
        if not len(candidates):
            return False
        total = np.where(free < 0, 0, free).sum(axis=1)[candidates]
        order = {
            Placement.FIRST_FIT: candidates,
            Placement.BEST_FIT: candidates[np.argsort(total, kind="stable")],
            Placement.WORST_FIT: candidates[np.argsort(-total, kind="stable")],
        }[rule]
        for node in order[:16]:
            leases = nodes[node].admit(pod, now)
            if leases is not None:
                placed[at] = (int(node), leases)
                free[node, : len(nodes[node].devices)] = nodes[node].free_milli()
                heapq.heappush(events, (pod["end"], 0, at))
                waits.append(now - pod["start"])
                return True
        return False

    while events:
        now, kind, at = heapq.heappop(events)
        if kind == 1:
            if not try_place(at, now):
                waiting.append(at)
        else:
            node, leases = placed.pop(at)
            nodes[node].release(leases)
            free[node, : len(nodes[node].devices)] = nodes[node].free_milli()
            waiting = [w for w in waiting if trace[w]["end"] > now]  # gone before admitted
            waiting = [w for w in waiting if not try_place(w, now)]
        count += 1
        if count % 250 == 0:
            views = [v for n in nodes for v in n.views()]
            stuck = stranded(views, nodes[0].rules, sizes).thread_pct
            partly = np.where((free > 0) & (free < 1000), free, 0).sum()
            total_free = np.where(free > 0, free, 0).sum()
            samples.append((stuck * 10 / max(total_free, 1), partly / max(total_free, 1)))
    admitted = len(waits)
    return {
        "supply": supply,
        "gpus": sum(len(n.devices) for n in nodes),
        "speedup": speedup,
        "rule": rule.value,
        "gpu_pods": len(trace),
        "admitted_share": admitted / len(trace),
        "admitted_after_waiting": int(sum(1 for w in waits if w > 0)),
        "mean_wait_s_of_admitted": float(np.mean(waits)) if waits else 0.0,
        "never_admitted": len(trace) - admitted,
        "stranded_share_of_free": float(np.mean([s[0] for s in samples])) if samples else 0.0,
        "fragmented_share_of_free": float(np.mean([s[1] for s in samples])) if samples else 0.0,
    }


# (share of the nodes kept, arrival speed-up): the real cluster in real time never fills up
# (the whole trace fits at once), so smaller slices of it and denser arrivals add pressure.
SCENARIOS = ((1.0, 1.0), (0.1, 100.0), (0.1, 300.0), (0.1, 1000.0))


def run(openb: Path) -> list[dict[str, Any]]:
    return [replay(openb, rule, k, supply) for supply, k in SCENARIOS for rule in Placement]


def report(table: list[dict[str, Any]]) -> None:
    write_table(
        "openb",
        table,
        title="Experiment 2: node-local fractional replay of the openb pods",
        note=(
            "Real trace: Alibaba cluster-trace-gpu-v2023 (openb), default pod list, GPU pods "
            "only, on its 1,213 GPU nodes; each node decides with the agent's admission "
            "policy. Memory per model is assumed (the trace has none); see docs/replay.md."
        ),
    )
    plot(
        "openb",
        {
            f"{r['rule']} {r['supply']:g} x{r['speedup']:g}": (
                ["admitted", "stranded", "fragmented"],
                [r["admitted_share"], r["stranded_share_of_free"], r["fragmented_share_of_free"]],
            )
            for r in table
            if r["supply"] < 1
        },
        title="openb replay by placement rule",
        xlabel="",
        ylabel="share",
        kind="bar",
    )
