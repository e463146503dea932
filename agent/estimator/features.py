"""Features of a co-location record, versioned. Pure.

For a target workload next to its peers on a device:

- the target's solo counters and thread percentage (``t.<counter>``, ``t.thread_pct``);
- the peers, without regard to order: their count, the sum and max of each counter
  (``p.sum.<counter>``, ``p.max.<counter>``), the sum of their thread percentages and of
  their memory as a fraction of the device (``p.thread_pct_sum``, ``p.memory_frac_sum``);
- the device: memory in GiB and a model class (``d.memory_gib``, ``d.class``);
- (version 2) the physics of sharing, from each workload's busy shares (``busy_shares``:
  SM busy capped by its thread percentage, memory bus busy) and memory used
  (``fb_used_bytes``, else its memory limit, as a fraction of the device): the total demand
  of the set on each resource (``x.<r>_total``), the peers' part of it (``x.<r>_peers``),
  the target's share of it (``x.<r>_share``), the headroom of the tighter of SMs and memory
  bus (``x.headroom``: 1 - the larger total, negative when oversubscribed), and the sum of
  solo ``gpu_util`` the utilisation-sum rule reads (``x.util_sum``).

The device's counters while the set ran together (``dc.*``) are no longer features: they
are measured during the co-run, so they carry its outcome (a set that slows down shows less
busy), and the live gate, which decides before the candidate has run, never has them (it
read them as 0). Version 1 models that use them still load and are fed the same values.

Version 3 adds what MPS shares need: a workload's counters are taken *at its share*
(``share_counters`` at its thread percentage, when measured there; see
``records.counters_at_share``); the L2 cache joins the resources (``l2_active``, else
``l2_util`` / 100), and the memory system as a whole, L2 and DRAM together
(``x.memsys_total``, ``x.memsys_peers``); ``x.threads_over`` is how far the thread shares add
up above the whole device; ``s.<counter>`` is the set's total of each counter (target and
peers), whatever its name.

The feature list is chosen from the training data and stored with the model; a counter
missing from a record reads as 0. ``monotonic`` gives the direction the physics fixes for a
feature (-1: more of it never raises the target's retention), for the forest's
``monotonic_cst``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from agent.estimator.records import Record, Workload, counters_at_share

FEATURE_VERSION = 3
READABLE_FEATURE_VERSIONS = (1, 2, 3)
GIB = 1024**3
# Coarse model classes by generation, oldest first; unknown models read as 0.
MODEL_CLASSES = (
    ("K80", 1),
    ("P100", 2),
    ("V100", 3),
    ("T4", 3),
    ("A10", 4),
    ("A100", 5),
    ("L4", 5),
    ("L40", 5),
    ("H100", 6),
    ("H200", 7),
    ("B200", 8),
)


def model_class(model: str) -> float:
    upper = model.upper()
    return float(max((cls for name, cls in MODEL_CLASSES if name in upper), default=0))


def counter_names(records: Iterable[Record]) -> tuple[list[str], list[str]]:
    """Workload counter names and device counter names present in the records, sorted."""
    workload: set[str] = set()
    device: set[str] = set()
    for record in records:
        for member in (record.target, *record.peers):
            workload.update(member.counters)
            for counters in member.share_counters.values():
                workload.update(counters)
        if record.device_counters:
            device.update(record.device_counters)
    return sorted(workload), sorted(device)


RESOURCES = ("sm", "dram", "mem", "threads", "l2")
PHYSICS = (
    [f"x.{r}_total" for r in RESOURCES]
    + [f"x.{r}_peers" for r in RESOURCES]
    + [f"x.{r}_share" for r in RESOURCES]
    + ["x.headroom", "x.util_sum", "x.threads_over", "x.memsys_total", "x.memsys_peers"]
)
# Counters that measure load: more of them on the peers never helps the target.
LOAD_COUNTERS = frozenset(
    {
        "gpu_util",
        "mem_util",
        "sm_active",
        "dram_active",
        "tensor_active",
        "fb_used_bytes",
        "l2_active",
        "l2_util",
        "dram_util",
    }
)


def feature_names(
    workload_counters: Sequence[str], device_counters: Sequence[str] = ()
) -> list[str]:
    """Version 2 features; ``device_counters`` (``dc.*``) are accepted and left out (see
    the module's docstring)."""
    names = [f"t.{c}" for c in workload_counters] + ["t.thread_pct"]
    names += ["p.count", "p.thread_pct_sum", "p.memory_frac_sum"]
    names += [f"p.sum.{c}" for c in workload_counters]
    names += [f"p.max.{c}" for c in workload_counters]
    names += [f"s.{c}" for c in workload_counters]
    names += ["d.memory_gib", "d.class"]
    return names + [n for n in PHYSICS if _measured(n, workload_counters)]


def _measured(name: str, workload_counters: Sequence[str]) -> bool:
    """Whether the records carry what a physics feature reads: ``x.util_sum`` reads solo
    ``gpu_util``, the L2 features ``l2_active`` or ``l2_util``; without them they would be
    columns of zeros a rule could be read into."""
    if name == "x.util_sum":
        return "gpu_util" in workload_counters
    if name.startswith(("x.l2_", "x.memsys_")):
        return bool({"l2_active", "l2_util"} & set(workload_counters))
    return True


def monotonic(name: str) -> int:
    """-1 where more of the feature never raises the target's retention (peer and total
    demand), +1 where more never lowers it (headroom), 0 where the physics does not say."""
    if name == "x.headroom":
        return 1
    if name.endswith(("_total", "_peers")) or name in ("x.util_sum", "x.threads_over", "p.count"):
        return -1
    if name in ("p.thread_pct_sum", "p.memory_frac_sum"):
        return -1
    if name.startswith(("p.sum.", "p.max.")) and name.split(".", 2)[2] in LOAD_COUNTERS:
        return -1
    return 0


def features(record: Record, names: Sequence[str]) -> list[float]:
    values = _values(record)
    return [values.get(name, 0.0) for name in names]


def _values(record: Record) -> dict[str, float]:
    own_counters = counters_at_share(record.target)
    values = {f"t.{k}": v for k, v in own_counters.items()}
    values.update({f"s.{k}": v for k, v in own_counters.items()})
    values["t.thread_pct"] = record.target.thread_pct
    peers = record.peers
    values["p.count"] = float(len(peers))
    values["p.thread_pct_sum"] = sum(p.thread_pct for p in peers)
    values["p.memory_frac_sum"] = sum(p.memory_bytes for p in peers) / record.gpu_memory_bytes
    for peer in peers:
        for name, value in counters_at_share(peer).items():
            values[f"p.sum.{name}"] = values.get(f"p.sum.{name}", 0.0) + value
            values[f"p.max.{name}"] = max(values.get(f"p.max.{name}", value), value)
            values[f"s.{name}"] = values.get(f"s.{name}", 0.0) + value
    values["d.memory_gib"] = record.gpu_memory_bytes / GIB
    values["d.class"] = model_class(record.gpu_model)
    for name, value in (record.device_counters or {}).items():
        values[f"dc.{name}"] = value
    own = demand(record.target, record.gpu_memory_bytes)
    others = _sum_rows([demand(p, record.gpu_memory_bytes) for p in record.peers])
    util = sum(counters_at_share(w).get("gpu_util", 0.0) for w in (record.target, *peers))
    for name, column in _physics(
        np.asarray([own]), np.asarray([others]), np.asarray([util])
    ).items():
        values[name] = float(column[0])
    return values


def demand(workload: Workload, gpu_memory_bytes: int) -> tuple[float, ...]:
    """A workload's demand on the SMs, the memory bus, memory, threads and the L2 cache
    (``RESOURCES``), as fractions of the device."""
    counters = counters_at_share(workload)
    sm, dram = busy_shares(counters, workload.thread_pct)
    used = counters.get("fb_used_bytes") or float(workload.memory_bytes)
    return sm, dram, used / gpu_memory_bytes, workload.thread_pct / 100.0, l2_share(counters)


def l2_share(counters: Mapping[str, float]) -> float:
    """How busy a workload keeps the L2 cache: ``l2_active``, else ``l2_util`` / 100; 0
    when neither is measured."""
    value = counters.get("l2_active", counters.get("l2_util", 0.0) / 100.0)
    return max(0.0, min(float(value), 1.0))


def _sum_rows(rows: Sequence[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(float(sum(r[i] for r in rows)) for i in range(len(RESOURCES)))


def _physics(
    own: npt.NDArray[np.float64], peers: npt.NDArray[np.float64], util: npt.NDArray[np.float64]
) -> dict[str, npt.NDArray[np.float64]]:
    """The physics columns from own and peer demand (rows x the four resources), as
    ``_values`` makes them for one record."""
    total = own + peers
    safe = np.where(total > 0, total, 1.0)
    columns = {}
    for i, resource in enumerate(RESOURCES):
        columns[f"x.{resource}_total"] = total[:, i]
        columns[f"x.{resource}_peers"] = peers[:, i]
        columns[f"x.{resource}_share"] = np.where(total[:, i] > 0, own[:, i] / safe[:, i], 1.0)
    columns["x.headroom"] = 1.0 - np.maximum(total[:, 0], total[:, 1])
    columns["x.util_sum"] = util
    columns["x.threads_over"] = np.maximum(0.0, total[:, 3] - 1.0)
    columns["x.memsys_total"] = total[:, 1] + total[:, 4]
    columns["x.memsys_peers"] = peers[:, 1] + peers[:, 4]
    return columns


def set_features(
    gpu_model: str,
    gpu_memory_bytes: int,
    workloads: Sequence[Workload],
    names: Sequence[str],
) -> npt.NDArray[np.float64]:
    """The feature rows of every workload of a set next to all the others, in O(n) per
    counter: the same values as ``features`` of each leave-one-out record, without building
    n records of n - 1 peers."""
    count = len(workloads)
    measured = [counters_at_share(w) for w in workloads]
    counters = sorted({c for m in measured for c in m})
    own = np.full((count, len(counters)), np.nan)
    for row, at_share in enumerate(measured):
        for column, name in enumerate(counters):
            value = at_share.get(name)
            if value is not None:
                own[row, column] = value
    present = ~np.isnan(own)
    filled = np.where(present, own, 0.0)
    peer_sum = filled.sum(axis=0) - filled
    peer_max = _max_of_others(np.where(present, own, -np.inf))
    threads = np.asarray([w.thread_pct for w in workloads], dtype=np.float64)
    memory = np.asarray([float(w.memory_bytes) for w in workloads], dtype=np.float64)
    columns: dict[str, npt.NDArray[np.float64]] = {
        "t.thread_pct": threads,
        "p.count": np.full(count, float(count - 1)),
        "p.thread_pct_sum": threads.sum() - threads,
        "p.memory_frac_sum": (memory.sum() - memory) / gpu_memory_bytes,
        "d.memory_gib": np.full(count, gpu_memory_bytes / GIB),
        "d.class": np.full(count, model_class(gpu_model)),
    }
    for column, name in enumerate(counters):
        columns[f"t.{name}"] = filled[:, column]
        columns[f"s.{name}"] = np.full(count, filled[:, column].sum())
        columns[f"p.sum.{name}"] = peer_sum[:, column]
        columns[f"p.max.{name}"] = np.where(
            np.isfinite(peer_max[:, column]), peer_max[:, column], 0.0
        )
    own = np.asarray([demand(w, gpu_memory_bytes) for w in workloads], dtype=np.float64)
    util = np.asarray([m.get("gpu_util", 0.0) for m in measured], dtype=np.float64)
    columns.update(_physics(own, own.sum(axis=0) - own, np.full(count, util.sum())))
    zeros = np.zeros(count)
    return np.stack([columns.get(name, zeros) for name in names], axis=1)


def _max_of_others(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """For each row, the column-wise maximum over all other rows (-inf when none)."""
    if values.shape[0] < 2:
        return np.full_like(values, -np.inf)
    order = np.argsort(-values, axis=0, kind="stable")
    first = np.take_along_axis(values, order[:1], axis=0)[0]
    second = np.take_along_axis(values, order[1:2], axis=0)[0]
    is_top = order[0][None, :] == np.arange(values.shape[0])[:, None]
    others: npt.NDArray[np.float64] = np.where(is_top, second[None, :], first[None, :])
    return others


def busy_shares(counters: Mapping[str, float], thread_pct: float = 100.0) -> tuple[float, float]:
    """How much of the SMs and of the memory bus a workload keeps busy, from its counters
    (``sm_active``, else ``gpu_util`` / 100; ``dram_active``, else ``mem_util`` / 100), the
    SM share capped by its thread percentage; both in [0, 1]."""
    sm = counters.get("sm_active", counters.get("gpu_util", 0.0) / 100.0)
    dram = counters.get(
        "dram_active", counters.get("mem_util", counters.get("dram_util", 0.0)) / 100.0
    )
    return max(0.0, min(float(sm), thread_pct / 100.0, 1.0)), max(0.0, min(float(dram), 1.0))
