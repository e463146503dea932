import itertools

import pytest

from agent.core.errors import LeaseTransitionError
from agent.core.lease import ALLOWED_TRANSITIONS, Lease, LeaseState, can_transition, transition
from agent.core.types import PriorityClass

S = LeaseState
# The state machine of DESIGN section 2, written out independently of the code.
EXPECTED_EDGES = {
    (S.RESERVED, S.ADMITTED),
    (S.RESERVED, S.EXPIRED),
    (S.RESERVED, S.RELEASED),
    (S.ADMITTED, S.READY),
    (S.ADMITTED, S.INEFFECTIVE),
    (S.ADMITTED, S.RELEASED),
    (S.ADMITTED, S.EVICTED),
    (S.ADMITTED, S.FAILED),
    (S.READY, S.RELEASED),
    (S.READY, S.EVICTED),
    (S.READY, S.FAILED),
}


def make_lease(state: LeaseState) -> Lease:
    return Lease(
        lease_id="l-1",
        request_id="r-1",
        tenant="t",
        trust_domain="d",
        device_uuid="GPU-1",
        priority=PriorityClass.BEST_EFFORT,
        memory_bytes=1,
        thread_pct=10.0,
        state=state,
        created_at=1.0,
        updated_at=1.0,
    )


@pytest.mark.parametrize(("current", "target"), list(itertools.product(S, S)))
def test_every_pair_of_states(current: LeaseState, target: LeaseState) -> None:
    allowed = (current, target) in EXPECTED_EDGES
    assert can_transition(current, target) is allowed
    if allowed:
        moved = transition(make_lease(current), target, at=5.0, reason="why")
        assert (moved.state, moved.updated_at, moved.reason) == (target, 5.0, "why")
    else:
        with pytest.raises(LeaseTransitionError, match=f"{current.value} -> {target.value}"):
            transition(make_lease(current), target, at=5.0)


def test_terminal_states_and_capacity() -> None:
    terminal = {s for s in S if s.is_terminal}
    assert terminal == {S.RELEASED, S.EXPIRED, S.EVICTED, S.FAILED, S.INEFFECTIVE}
    assert {s for s in S if s.holds_capacity} == {S.RESERVED, S.ADMITTED, S.READY}
    assert set(ALLOWED_TRANSITIONS) == set(S)


def test_transition_leaves_the_original_untouched() -> None:
    lease = make_lease(S.ADMITTED)
    transition(lease, S.READY, at=2.0)
    assert lease.state is S.ADMITTED
