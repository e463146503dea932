"""What a caller without the observer role is shown of other callers' leases."""

from __future__ import annotations

import pytest

from agent.api import redact
from agent.api.identity import LOCAL, Caller
from agent.api.proto import agent_pb2 as pb
from agent.core.types import Event

MINE, THEIRS = "l-AAAAAAAAAAAAAAAA", "l-BBBBBBBBBBBBBBBB"
OWNERS = {MINE: "alice", THEIRS: "bob"}
ALICE, OBSERVER = Caller("alice"), Caller("carol", observer=True)


@pytest.mark.parametrize(
    ("text", "keep", "shown"),
    [
        (f"lease {THEIRS} released", (), f"lease {redact.HIDDEN} released"),
        (f"{MINE} preempted {THEIRS}", (MINE,), f"{MINE} preempted {redact.HIDDEN}"),
        ("no lease here: pool-1 full-2", (), "no lease here: pool-1 full-2"),
        (f"{THEIRS}x", (), f"{THEIRS}x"),  # not an id: one character too long
    ],
)
def test_scrub(text: str, keep: tuple[str, ...], shown: str) -> None:
    assert redact.scrub(text, keep) == shown


def preempting_answer() -> pb.AdmitResponse:
    response = pb.AdmitResponse()
    response.lease.lease_id = "l-CCCCCCCCCCCCCCCC"
    response.decision.preempted_lease_ids.extend([MINE, THEIRS])
    response.decision.predictions.update({"candidate": 0.9, MINE: 0.8, THEIRS: 0.7})
    response.decision.attempts.add(predictions={THEIRS: 0.7}, detail=f"would slow {THEIRS}")
    response.decision.message = f"admitted by preempting {MINE} and {THEIRS}"
    return response


def test_an_admit_answer_hides_other_callers_leases() -> None:
    shown = redact.admit_for(preempting_answer(), ALICE, lambda x: OWNERS.get(x, ""))
    assert list(shown.decision.preempted_lease_ids) == [MINE, redact.HIDDEN]
    assert dict(shown.decision.predictions) == {"candidate": 0.9, MINE: 0.8, "other-1": 0.7}
    assert dict(shown.decision.attempts[0].predictions) == {"other-1": 0.7}
    assert THEIRS.encode() not in shown.SerializeToString()
    assert MINE in shown.decision.message


@pytest.mark.parametrize("caller", [OBSERVER, LOCAL])
def test_observers_and_the_local_socket_see_everything(caller: Caller) -> None:
    shown = redact.admit_for(preempting_answer(), caller, lambda x: OWNERS.get(x, ""))
    assert shown == preempting_answer()


def lease_event(lease_id: str) -> Event:
    return Event(
        7, 1.0, "lease.released", f"lease {lease_id} released",
        lease_id=lease_id, attrs={"owner": OWNERS[lease_id], "request_id": "r-1"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("caller", "lease_id", "view"),
    [
        (ALICE, MINE, redact.OWN),
        (ALICE, THEIRS, redact.FOREIGN),
        (OBSERVER, THEIRS, redact.FULL),
        (LOCAL, THEIRS, redact.FULL),
    ],
)
def test_event_views(caller: Caller, lease_id: str, view: int) -> None:
    assert redact.event_view(lease_event(lease_id), caller) == view


def test_a_foreign_event_loses_its_ids_and_owner() -> None:
    shown = redact.event_as(lease_event(THEIRS), redact.FOREIGN)
    assert shown.lease_id is None and THEIRS not in shown.message
    assert "owner" not in shown.attrs and "request_id" not in shown.attrs
    own = redact.event_as(lease_event(MINE), redact.OWN)
    assert own.lease_id == MINE and own.attrs["owner"] == "alice"


def test_a_lease_made_before_owners_is_nobody_s_own() -> None:
    assert not ALICE.sees("")
    assert OBSERVER.sees("")
