"""Placement of many candidates on many GPUs, fast enough for replays of a whole cluster. Pure.

Capacity is counted in thousandths of a GPU (milli-GPU, as the openb trace does). A request
below one GPU takes that share of one GPU; a request of one GPU or more takes that many
whole, untouched GPUs on one node (a fraction above one rounds up). The placement rule is
the agent's: best-fit (the least room left), first-fit (the lowest index) or worst-fit
(the most room left).

Best-fit keeps GPUs in buckets by free capacity and nodes in buckets by their number of
whole free GPUs, each bucket a stack with lazy deletion, plus the sorted list of
non-empty levels: a placement costs a bisection and a few list operations. First-fit and
worst-fit walk max-segment-trees (over GPUs for a share, over nodes for whole GPUs) in
O(log n). Ordering a batch is a stable sort; placing it is O(n log n) in all.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.admission.policy import Placement

FULL = 1000  # milli-GPU in one GPU


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a request went: its node, its GPUs and the milli-GPU it holds on each."""

    node: int
    gpus: tuple[int, ...]
    milli: int


def milli_of(gpus: float) -> int:
    return max(1, round(gpus * FULL)) if gpus < 1 else FULL * math.ceil(gpus - 1e-9)


class _MaxTree:
    """Max over a list, with the leftmost index whose value reaches a bound."""

    def __init__(self, values: Sequence[int]) -> None:
        self.size = 1
        while self.size < max(1, len(values)):
            self.size *= 2
        self.tree = [-1] * (2 * self.size)
        self.tree[self.size : self.size + len(values)] = list(values)
        for at in range(self.size - 1, 0, -1):
            self.tree[at] = max(self.tree[2 * at], self.tree[2 * at + 1])

    def set(self, index: int, value: int) -> None:
        at = index + self.size
        self.tree[at] = value
        at //= 2
        while at:
            self.tree[at] = max(self.tree[2 * at], self.tree[2 * at + 1])
            at //= 2

    def leftmost(self, bound: int) -> int:
        """The lowest index with a value >= ``bound``, or -1."""
        tree = self.tree
        if tree[1] < bound:
            return -1
        at = 1
        while at < self.size:
            at = 2 * at if tree[2 * at] >= bound else 2 * at + 1
        return at - self.size

    @property
    def top(self) -> int:
        return self.tree[1]


class _Buckets:
    """Items by an integer level: the smallest level >= a bound, and one item at it."""

    def __init__(self) -> None:
        self.stacks: dict[int, list[int]] = {}
        self.levels: list[int] = []  # sorted, each with a non-empty stack (maybe stale)

    def add(self, item: int, level: int) -> None:
        stack = self.stacks.get(level)
        if stack is None:
            self.stacks[level] = [item]
            bisect.insort(self.levels, level)
        else:
            stack.append(item)

    def smallest_at_least(self, bound: int, current: list[int]) -> int:
        """An item whose ``current`` level is the smallest >= ``bound``; -1 if none."""
        levels = self.levels
        at = bisect.bisect_left(levels, bound)
        while at < len(levels):
            level = levels[at]
            stack = self.stacks[level]
            while stack and current[stack[-1]] != level:
                stack.pop()  # moved since it was filed here
            if stack:
                return stack[-1]
            del self.stacks[level]
            del levels[at]
        return -1


class Cluster:
    def __init__(self, gpus_per_node: Sequence[int], placement: Placement) -> None:
        self.placement = placement
        self.node_of: list[int] = []
        self.gpus_of: list[list[int]] = []
        for node, count in enumerate(gpus_per_node):
            self.gpus_of.append(list(range(len(self.node_of), len(self.node_of) + count)))
            self.node_of.extend([node] * count)
        self.free = [FULL] * len(self.node_of)  # per GPU
        self.whole = [len(g) for g in self.gpus_of]  # untouched GPUs per node
        self.total_milli = FULL * len(self.free)
        self.used_milli = 0
        if placement is Placement.BEST_FIT:
            self._gpu_buckets, self._node_buckets = _Buckets(), _Buckets()
            for gpu in range(len(self.free)):
                self._gpu_buckets.add(gpu, FULL)
            for node, count in enumerate(self.whole):
                self._node_buckets.add(node, count)
        else:
            self._gpu_tree, self._node_tree = _MaxTree(self.free), _MaxTree(self.whole)

    # -- placing -----------------------------------------------------------------------

    def place(self, gpus: float) -> Slot | None:
        milli = milli_of(gpus)
        if milli < FULL:
            gpu = self._share_gpu(milli)
            if gpu < 0:
                return None
            self._take(gpu, milli)
            return Slot(self.node_of[gpu], (gpu,), milli)
        count = milli // FULL
        node = self._whole_node(count)
        if node < 0:
            return None
        taken = tuple([g for g in self.gpus_of[node] if self.free[g] == FULL][:count])
        for gpu in taken:
            self._take(gpu, FULL)
        return Slot(node, taken, FULL)

    def release(self, slot: Slot) -> None:
        for gpu in slot.gpus:
            self._give(gpu, slot.milli)

    def _share_gpu(self, milli: int) -> int:
        if self.placement is Placement.BEST_FIT:
            return self._gpu_buckets.smallest_at_least(milli, self.free)
        if self.placement is Placement.FIRST_FIT:
            return self._gpu_tree.leftmost(milli)
        top = self._gpu_tree.top
        return self._gpu_tree.leftmost(top) if top >= milli else -1

    def _whole_node(self, count: int) -> int:
        if self.placement is Placement.BEST_FIT:
            return self._node_buckets.smallest_at_least(count, self.whole)
        if self.placement is Placement.FIRST_FIT:
            return self._node_tree.leftmost(count)
        top = self._node_tree.top
        return self._node_tree.leftmost(top) if top >= count else -1

    def _take(self, gpu: int, milli: int) -> None:
        self._set(gpu, self.free[gpu] - milli, was_full=self.free[gpu] == FULL)
        self.used_milli += milli

    def _give(self, gpu: int, milli: int) -> None:
        self._set(gpu, self.free[gpu] + milli, was_full=False)
        self.used_milli -= milli

    def _set(self, gpu: int, free: int, *, was_full: bool) -> None:
        node = self.node_of[gpu]
        self.free[gpu] = free
        whole_change = (free == FULL) - was_full
        if whole_change:
            self.whole[node] += whole_change
        if self.placement is Placement.BEST_FIT:
            self._gpu_buckets.add(gpu, free)
            if whole_change:
                self._node_buckets.add(node, self.whole[node])
        else:
            self._gpu_tree.set(gpu, free)
            if whole_change:
                self._node_tree.set(node, self.whole[node])

    # -- views -------------------------------------------------------------------------

    @property
    def free_whole_gpus(self) -> int:
        return sum(self.whole)

    def largest_whole_block(self) -> int:
        return max(self.whole, default=0)


def order_and_place(
    cluster: Cluster, gpus: Sequence[float], scores: Sequence[float] | None = None
) -> list[Slot | None]:
    """Place candidates highest score first (arrival order breaking ties; arrival order
    alone without scores); the answer is in candidate order."""
    count = len(gpus)
    order = (
        range(count)
        if scores is None  # a stable sort: ties keep arrival order
        else np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable").tolist()
    )
    slots: list[Slot | None] = [None] * count
    place = cluster.place
    for at in order:
        slots[at] = place(gpus[at])
    return slots
