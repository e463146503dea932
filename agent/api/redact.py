"""What a caller is shown of other callers' leases.

Lease ids act as capabilities (a lease id is what Release names), so a caller without the
``observer`` role sees the ids of its own leases only: other callers' leases keep their
sizes, states and devices (a scheduler needs the node's shape) but lose their lease,
request and gang ids and owner, and any lease id in a message or map key is replaced.
Pure functions on the wire messages and on events; the caller comes from
:mod:`agent.api.identity`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Mapping
from dataclasses import replace

from agent.api.identity import Caller
from agent.api.proto import agent_pb2 as pb
from agent.core.lease import LEASE_ID_PATTERN
from agent.core.types import Event

HIDDEN = "l-hidden"
_LEASE_ID = re.compile(LEASE_ID_PATTERN + r"(?![A-Za-z0-9_-])")
FULL, OWN, FOREIGN = 0, 1, 2  # how much of an event a caller sees
_PRIVATE_ATTRS = ("owner", "request_id")


def scrub(text: str, keep: Container[str] = ()) -> str:
    """``text`` with every lease id not in ``keep`` replaced by :data:`HIDDEN`."""
    if "l-" not in text:
        return text
    return _LEASE_ID.sub(lambda m: m.group(0) if m.group(0) in keep else HIDDEN, text)


def hide_lease(lease: pb.Lease) -> None:
    lease.lease_id = lease.request_id = lease.gang_id = lease.owner = ""
    lease.reason = scrub(lease.reason)


def node_for(response: pb.GetNodeResponse, caller: Caller) -> pb.GetNodeResponse:
    """GetNode as ``caller`` may see it (changed in place)."""
    if caller.admin or caller.observer:
        return response
    own = {x.lease_id for x in response.leases if caller.sees(x.owner)}
    for lease in response.leases:
        if lease.lease_id not in own:
            hide_lease(lease)
    for lease_id in [k for k in response.retention_estimates if k not in own]:
        del response.retention_estimates[lease_id]
    return response


def _rename(predictions: Mapping[str, float], names: dict[str, str]) -> dict[str, float]:
    """Other callers' lease ids as ``other-1``, ``other-2``, ... (one name per lease in
    one answer); ``names`` holds what is kept as it is."""
    shown: dict[str, float] = {}
    for key, value in predictions.items():
        if key not in names:
            names[key] = f"other-{sum(v.startswith('other-') for v in names.values()) + 1}"
        shown[names[key]] = value
    return shown


def admit_for(
    response: pb.AdmitResponse, caller: Caller, owner_of: Callable[[str], str]
) -> pb.AdmitResponse:
    """An Admit or Explain answer as ``caller`` may see it (changed in place): other
    callers' lease ids in the preemptions, predictions and messages are hidden."""
    if caller.admin or caller.observer:
        return response
    decision = response.decision
    mentioned = set(decision.preempted_lease_ids) | set(decision.predictions)
    for attempt in decision.attempts:
        mentioned |= set(attempt.predictions)
    mentioned |= set(_LEASE_ID.findall(decision.message))
    if not mentioned - {"candidate"}:
        return response
    own = {x for x in mentioned if x != "candidate" and caller.sees(owner_of(x))}
    if response.lease.lease_id:
        own.add(response.lease.lease_id)
    ids = [x if x in own else HIDDEN for x in decision.preempted_lease_ids]
    del decision.preempted_lease_ids[:]
    decision.preempted_lease_ids.extend(ids)
    names = {x: x for x in (*own, "candidate")}
    _replace_map(decision.predictions, _rename(decision.predictions, names))
    for attempt in decision.attempts:
        _replace_map(attempt.predictions, _rename(attempt.predictions, names))
        attempt.detail = scrub(attempt.detail, own)
    decision.message = scrub(decision.message, own)
    return response


def _replace_map(target: object, values: Mapping[str, float]) -> None:
    target.clear()  # type: ignore[attr-defined]
    target.update(values)  # type: ignore[attr-defined]


def event_view(event: Event, caller: Caller) -> int:
    """FULL (observer, admin, or an event about no lease), OWN (about the caller's lease)
    or FOREIGN (about another caller's lease)."""
    if caller.admin or caller.observer:
        return FULL
    if not event.lease_id and "l-" not in event.message:
        return FULL
    return OWN if event.lease_id and caller.sees(event.attrs.get("owner", "")) else FOREIGN


def event_as(event: Event, view: int) -> Event:
    """``event`` as seen in ``view`` (see :func:`event_view`)."""
    if view == FULL:
        return event
    keep = {event.lease_id} if view == OWN and event.lease_id else set()
    attrs = {
        k: scrub(v, keep) for k, v in event.attrs.items() if view == OWN or k not in _PRIVATE_ATTRS
    }
    lease_id = event.lease_id if view == OWN else None
    return replace(event, lease_id=lease_id, message=scrub(event.message, keep), attrs=attrs)
