"""What bench/dra.py watches and checks beside its churn: each node's ResourceSlice writes
(stamped as the API server stores them) and their figures, and the checks of every pod's
injection, every agent's ledger and the API server's claims."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from itertools import pairwise
from typing import Any

from agent.admission.policy import Rules
from agent.api.proto import agent_pb2 as pb
from agent.core.quantity import quantity
from agent.core.units import MIB
from bench.dra_plan import WINDOW_S
from tests.kubeworld.apiserver import (
    RESOURCE_SLICES,
    FakeApiServer,
    Obj,
    Selector,
    Watcher,
)

# -- ResourceSlice writes --------------------------------------------------------------------


class _Stamped(asyncio.Queue[bytes | None]):
    """A watcher's queue that keeps nothing: each line is handed to ``record`` as it is
    stored (the API server puts a change's line in every watcher's queue at its commit)."""

    def __init__(self, record: Callable[[bytes], None]) -> None:
        super().__init__()
        self._record = record

    def put_nowait(self, item: bytes | None) -> None:
        if item is not None:
            self._record(item)


class SliceWrites:
    """Every ResourceSlice create, replace and delete, by node, stamped at its commit; and
    what each replace changed (``changed``: device field -> writes that changed it)."""

    def __init__(self, server: FakeApiServer) -> None:
        self.times: dict[str, list[float]] = {}
        self.changed: Counter[str] = Counter()
        self._last: dict[str, list[Obj]] = {}  # node -> its devices as last written
        self._server = server
        self._watcher = Watcher(RESOURCE_SLICES, "", Selector(), False, _Stamped(self._record))
        server.watchers.add(self._watcher)

    def _record(self, line: bytes) -> None:
        spec = json.loads(line)["object"]["spec"]
        node, devices = spec["nodeName"], spec.get("devices") or []
        self.times.setdefault(node, []).append(time.monotonic())
        if node in self._last:
            self.changed.update(device_changes(self._last[node], devices))
        self._last[node] = devices

    def close(self) -> None:
        self._server.watchers.discard(self._watcher)

    def between(self, start: float, end: float) -> dict[str, list[float]]:
        return {n: [t for t in ts if start <= t <= end] for n, ts in self.times.items()}


def device_changes(before: list[Obj], after: list[Obj]) -> set[str]:
    """The device fields (``attributes.<name>``, ``capacity``, ``taints``...) that differ."""
    if [d.get("name") for d in before] != [d.get("name") for d in after]:
        return {"devices"}
    found = set()
    for old, new in zip(before, after, strict=True):
        for key in set(old) | set(new):
            if key == "attributes":
                names = set(old.get(key) or {}) | set(new.get(key) or {})
                found |= {
                    f"attributes.{n}"
                    for n in names
                    if (old.get(key) or {}).get(n) != (new.get(key) or {}).get(n)
                }
            elif old.get(key) != new.get(key):
                found.add(key)
    return found


def most_in_window(times: list[float], window_s: float = WINDOW_S) -> int:
    """The most of ``times`` within any half-open window [t, t + window_s)."""
    ordered, most, first = sorted(times), 0, 0
    for last, at in enumerate(ordered):
        while at - ordered[first] >= window_s:
            first += 1
        most = max(most, last - first + 1)
    return most


def shortest_gap_s(times: list[float]) -> float | None:
    ordered = sorted(times)
    gaps = [b - a for a, b in pairwise(ordered)]
    return round(min(gaps), 3) if gaps else None


def slice_figures(writes: dict[str, list[float]], nodes: list[str], span_s: float) -> Obj:
    counts = [len(writes.get(n, [])) for n in nodes]
    gaps = [g for n in nodes if (g := shortest_gap_s(writes.get(n, []))) is not None]
    rates = [c / max(span_s, 1e-9) for c in counts]
    return {
        "slice_writes": sum(counts),
        "slice_writes_per_node_per_s_max": max(
            (most_in_window(writes.get(n, [])) for n in nodes), default=0
        ),
        "slice_writes_per_node_per_s_mean": round(sum(rates) / max(len(rates), 1), 3),
        "slice_writes_per_node_per_s_mean_max": round(max(rates, default=0.0), 3),
        "slice_write_gap_min_s": min(gaps, default=None),
    }


# -- the checks --------------------------------------------------------------------------------


def results_of(claim: Obj) -> list[Obj]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def claim_name_of(pod: Obj) -> str:
    """The name of the one ResourceClaim a pod of this benchmark uses."""
    status = pod.get("status") or {}
    for entry in status.get("resourceClaimStatuses") or []:
        if entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    return str((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName") or "")


def injection_problem(
    claim: Obj | None, env: dict[str, str], leases: list[Any], pod: str
) -> str | None:
    """Why a Running container does not carry exactly its own claim's lease and limits."""
    if claim is None or len(results_of(claim)) != 1:
        return "its claim is gone or not allocated to one device"
    consumed = results_of(claim)[0].get("consumedCapacity") or {}
    memory_bytes = int(quantity(str(consumed.get("memory", "0"))))
    threads = float(quantity(str(consumed.get("threads", "0"))))
    prefix = f"dra:{claim['metadata']['uid']}:"
    mine = [x for x in leases if x.request_id.startswith(prefix)]
    if len(mine) != 1:
        return f"{len(mine)} live leases of its claim"
    lease = mine[0]
    limit = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
    checks = {
        "lease pod": (lease.pod, pod),
        "GPUSHARE_LEASE_ID": (env.get("GPUSHARE_LEASE_ID"), lease.lease_id),
        "memory MiB": (limit.rpartition("=")[2].removesuffix("M"), str(memory_bytes // MIB)),
        "threads": (_number(env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")), threads),
        "lease memory": (lease.memory_bytes, memory_bytes),
        "lease threads": (lease.thread_pct, threads),
    }
    wrong = [f"{k} {got!r} != {want!r}" for k, (got, want) in checks.items() if got != want]
    return "; ".join(wrong) or None


def _number(text: str | None) -> float | None:
    try:
        return float(text or "")
    except ValueError:
        return None


def ledger_problems(node: str, answer: pb.GetNodeResponse, rules: Rules, clients: int) -> list[str]:
    """Devices whose ledger passed their memory, thread budget or client count."""
    memory = {d.uuid: d.memory_bytes for d in answer.devices}
    summed: Counter[str] = Counter()
    for lease in answer.leases:
        summed[lease.device_uuid] += lease.memory_bytes
    found = []
    for entry in answer.ledger:
        used = (
            max(entry.memory_committed_bytes, summed[entry.device_uuid])
            + entry.leases * rules.context_overhead_bytes
            + rules.reserve_bytes
        )
        where = f"{node}/{entry.device_uuid}"
        if entry.leases and used > memory.get(entry.device_uuid, 0):
            found.append(f"{where}: memory {used}")
        if entry.threads_committed_pct > rules.thread_budget_pct + 1e-6:
            found.append(f"{where}: threads {entry.threads_committed_pct}")
        if entry.leases > clients:
            found.append(f"{where}: {entry.leases} leases")
    return found


def api_problems(server: FakeApiServer) -> list[str]:
    """Devices whose allocated claims' consumedCapacity, summed, passes what the slice
    publishes (read straight from the store: no agent is asked)."""
    capacity: dict[tuple[str, str, str], Decimal] = {}
    for published in server.objects["resourceslices"].values():
        pool = published["spec"]["pool"]["name"]
        for device in published["spec"].get("devices") or []:
            for name, value in (device.get("capacity") or {}).items():
                capacity[(pool, device["name"], name)] = quantity(str(value["value"]))
    used: dict[tuple[str, str, str], Decimal] = {}
    for claim in server.objects["resourceclaims"].values():
        for result in results_of(claim):
            for name, value in (result.get("consumedCapacity") or {}).items():
                key = (result["pool"], result["device"], name)
                used[key] = used.get(key, Decimal(0)) + quantity(str(value))
    return [
        f"{'/'.join(key)}: {total} > {capacity[key]}"
        for key, total in used.items()
        if key in capacity and total > capacity[key]
    ]
