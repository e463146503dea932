"""A node's line of binds: who waits for whom as pods join, a gang goes in ahead of the
pods still waiting, turns end before they started, and a turn that overruns holds up the
others one at a time."""

from __future__ import annotations

import asyncio
import itertools
import time

from agent.legacy.cluster.line import Line, Lines, Turn


def test_pods_wait_for_the_one_before_them() -> None:
    line = Line()
    a, b = line.join(), line.join()
    assert (a.previous, b.previous) == (None, a)
    line.start(a)
    c = line.join()
    assert c.previous is b
    assert line.waiting == [b, c]


def test_a_gang_goes_in_after_the_pod_started_last_ahead_of_those_waiting() -> None:
    line = Line()
    a = line.join()
    line.start(a)
    b = line.join()  # waiting: not admitted yet
    g1, g2 = line.join_front(2)
    assert (g1.previous, g2.previous, b.previous) == (a, g1, g2)
    assert b.moved.is_set()  # b is woken to wait for the gang's last member
    assert line.waiting == [g1, g2, b]
    h1, *_ = line.join_front(1)  # a second gang: after the first, still ahead of b
    assert (h1.previous, b.previous) == (g2, h1)
    assert line.waiting == [g1, g2, h1, b]


def test_a_turn_that_ends_before_it_started_leaves_the_line() -> None:
    line = Line()
    a = line.join()
    line.start(a)
    b, c = line.join(), line.join()
    line.end(b, "", 1.0)  # its bind was cancelled while it waited
    assert c.previous is a and c.moved.is_set()
    assert line.waiting == [c]
    assert b.ended.is_set() and b.lease_id == ""
    line.start(c)
    line.end(c, "L-c", 2.0)
    assert (c.lease_id, c.ended_at) == ("L-c", 2.0)
    d = line.join()
    assert d.previous is c  # waits for c's allocation


def test_a_gang_in_an_empty_line_waits_for_nobody() -> None:
    line = Line()
    (g1,) = line.join_front(1)
    assert g1.previous is None


class Allocations:
    """What the lines read from the agents' cache: nothing is ever allocated."""

    def injector(self, node: str) -> str:
        return "device-plugin"

    async def wait_allocated(self, node: str, lease_id: str, timeout_s: float) -> bool:
        await asyncio.sleep(timeout_s)
        return False


async def test_turns_behind_a_stuck_one_start_one_at_a_time_not_together() -> None:
    """The first turn's bind does not end: the next starts after the hold, and the ones
    behind it wait for it in turn (they all timed out together and bound at once)."""
    hold_s = 0.2
    lines = Lines(Allocations(), hold_s=hold_s, clock=time.monotonic)
    stuck, *behind = lines.new_turns("n", 4)
    started: list[float] = []

    async def bind(turn: Turn) -> None:
        async with lines.taken("n", turn):
            started.append(time.monotonic())
            await asyncio.sleep(3600)  # never ends on its own

    first = asyncio.ensure_future(bind(stuck))
    others = [asyncio.ensure_future(bind(t)) for t in behind]
    async with asyncio.timeout(4):  # however slow the machine, three turns get to start
        while len(started) < 3:
            await asyncio.sleep(0.01)
    for task in (first, *others):
        task.cancel()
    await asyncio.gather(first, *others, return_exceptions=True)
    # the first, then one per hold: never two together (a loaded machine only widens gaps)
    gaps = [b - a for a, b in itertools.pairwise(started)]
    assert len(gaps) >= 2 and all(gap >= hold_s * 0.9 for gap in gaps), gaps


class Ended(Allocations):
    async def wait_allocated(self, node: str, lease_id: str, timeout_s: float) -> bool:
        return True  # its lease ended: nothing is left to allocate


async def test_a_lease_that_ended_lets_the_next_go_at_once() -> None:
    lines = Lines(Ended(), hold_s=30.0, clock=time.monotonic)
    first, second = lines.new_turns("n", 2)
    async with lines.taken("n", first):
        lines.end("n", first, "L-1")
    async with asyncio.timeout(1.0):
        async with lines.taken("n", second):
            pass
