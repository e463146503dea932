"""``run_as_uid`` on the wire: a UID is 0..4294967294, unset means "not said" (None in the
core, so the one-user rule does not apply), and a lease shows it only when it is known."""

from __future__ import annotations

import pytest

from agent.api import convert, validate
from agent.api.proto import agent_pb2 as pb
from agent.api.proto.reference import PROTO, parse, reference
from agent.client import AgentClient
from agent.core.errors import ValidationError
from agent.core.lease import Lease, LeaseState
from agent.core.types import PriorityClass, ReasonCode


def good_request(**fields: object) -> pb.Request:
    return pb.Request(
        request_id="r",
        tenant="t",
        trust_domain="a",
        priority=pb.BURSTABLE,
        memory_bytes=2**30,
        thread_pct=10,
        **fields,  # type: ignore[arg-type]
    )


def lease(run_as_uid: int | None) -> Lease:
    return Lease(
        lease_id="l-1",
        request_id="r",
        tenant="t",
        trust_domain="a",
        device_uuid="GPU-1",
        priority=PriorityClass.BURSTABLE,
        memory_bytes=2**30,
        thread_pct=10.0,
        state=LeaseState.ADMITTED,
        created_at=1.0,
        updated_at=1.0,
        run_as_uid=run_as_uid,
    )


@pytest.mark.parametrize("uid", [0, 1000, 4294967294])
def test_a_uid_in_range_reaches_the_core_request(uid: int) -> None:
    assert validate.request(good_request(run_as_uid=uid)).run_as_uid == uid


@pytest.mark.parametrize("uid", [-1, 4294967295, 2**40])
def test_a_uid_out_of_range_is_refused_naming_the_field(uid: int) -> None:
    with pytest.raises(ValidationError) as refused:
        validate.request(good_request(run_as_uid=uid), field="requests[2]")
    assert refused.value.field == "requests[2].run_as_uid"
    assert f"must be a UID from 0 to 4294967294 (got {uid})" in str(refused.value)


def test_a_request_without_the_field_says_nothing_of_its_user() -> None:
    assert validate.request(good_request()).run_as_uid is None


def test_uid_0_is_sent_and_kept_as_root_not_as_unset() -> None:
    """proto3 would drop a plain 0; the field has presence, so root stays root."""
    wire = pb.Request.FromString(good_request(run_as_uid=0).SerializeToString())
    assert wire.HasField("run_as_uid") and validate.request(wire).run_as_uid == 0


@pytest.mark.parametrize("uid", [0, 1000])
def test_a_known_uid_is_on_the_lease_message(uid: int) -> None:
    message = convert.lease_to_pb(lease(uid))
    again = pb.Lease.FromString(message.SerializeToString())
    assert again.HasField("run_as_uid") and again.run_as_uid == uid


def test_an_unknown_uid_is_left_unset_on_the_lease_message() -> None:
    message = convert.lease_to_pb(lease(None))
    assert not message.HasField("run_as_uid")
    assert "run_as_uid" not in str(message)


def test_the_client_sets_the_uid_only_when_given() -> None:
    assert AgentClient.request(run_as_uid=0).HasField("run_as_uid")
    assert AgentClient.request(run_as_uid=1000).run_as_uid == 1000
    assert not AgentClient.request().HasField("run_as_uid")
    assert not AgentClient.request(run_as_uid=None).HasField("run_as_uid")


def test_the_reference_parser_reads_an_optional_field() -> None:
    api = parse("message M {\n  optional int64 n = 1;  // a number, or unset\n}\n")
    (field,) = api.types[0].fields
    assert (field.name, field.type, field.description) == (
        "n",
        "optional int64",
        "a number, or unset",
    )


def test_the_reference_shows_the_uid_fields_as_optional_and_not_required() -> None:
    rows = [
        x for x in reference(PROTO.read_text()).splitlines() if x.startswith("| `run_as_uid` |")
    ]
    assert len(rows) == 2 and all("`optional int64`" in x and "**yes**" not in x for x in rows)


def test_decision_reason_names_every_reason_code() -> None:
    declared = next(t for t in parse(PROTO.read_text()).types if t.name == "Decision")
    (reason,) = [f.description for f in declared.fields if f.name == "reason"]
    assert [code.value for code in ReasonCode if code.value not in reason] == []
