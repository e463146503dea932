"""Refusals told as events, bounded: a request refused again is told once a minute, and
no more than so many refusals a second are told at all."""

from __future__ import annotations

from agent.core.types import AdmissionRequest, Decision, Event, PriorityClass, ReasonCode
from agent.node.events import EventLog
from agent.node.refusals import RefusalNotes
from tests.helpers import FakeClock

NO = Decision(False, reason=ReasonCode.NO_MEMORY, message="no device fits: GPU-0: needs 90 GiB")


def ask(request_id: str, pod: str = "") -> AdmissionRequest:
    return AdmissionRequest(
        request_id, "team-a", "team-a", PriorityClass.BURSTABLE, 2**30, 10, pod=pod
    )


def told(events: EventLog) -> list[Event]:
    """What the log was told (its listeners hear each event as it is recorded)."""
    heard: list[Event] = []
    events.listeners.append(heard.append)
    return heard


def test_a_refusal_is_an_event_naming_the_request_and_why() -> None:
    clock = FakeClock()
    events = EventLog(clock=clock)
    heard = told(events)
    notes = RefusalNotes(events, clock=clock)
    assert notes(ask("job-7", pod="team-a/job-7-0"), NO)
    [event] = heard
    assert event.kind == "lease.refused"
    assert dict(event.attrs) == {
        "request_id": "job-7", "tenant": "team-a", "reason": "NO_MEMORY", "pod": "team-a/job-7-0",
    }  # fmt: skip
    assert "needs 90 GiB" in event.message


def test_repeats_are_told_once_a_minute_and_the_rate_is_bounded() -> None:
    clock = FakeClock()
    events = EventLog(clock=clock)
    heard = told(events)
    notes = RefusalNotes(events, clock=clock, repeat_s=60, per_s=3)
    assert notes(ask("a"), NO) and not notes(ask("a"), NO)  # a scheduler retrying
    clock.advance(61)
    assert notes(ask("a"), NO)
    answers = [notes(ask(f"b{i}"), NO) for i in range(5)]
    assert answers == [True, True, False, False, False]  # 3 a second, "a" was one of them
    clock.advance(1)
    assert notes(ask("c"), NO)
    assert notes.dropped == 4
    assert len(heard) == 5
