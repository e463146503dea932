"""A node's line of binds: who waits for whom as pods join, a gang goes in ahead of the
pods still waiting, and turns end before they started."""

from __future__ import annotations

from agent.kube.line import Line


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
