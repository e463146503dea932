"""The API reference: every field and enum value of agent.proto is described, required
fields are marked, and the parser sees comments above and after a declaration."""

from __future__ import annotations

from agent.api.proto import agent_pb2 as pb
from agent.api.proto.reference import PROTO, Api, parse, reference, undocumented

SAMPLE = """
// A thing.
enum Colour {
  COLOUR_UNSPECIFIED = 0;  // not a colour
  // the colour of the sky
  BLUE = 1;
  RED = 2;
}

message Paint {
  // Required. What to paint with.
  Colour colour = 1;
  uint32 coats = 2;       // how many; 0: one
  // the brush's width,
  double width_mm = 3;    // millimetres
  string note = 4;
}
"""


def _api() -> Api:
    return parse(PROTO.read_text())


def _field(api: Api, message: str, name: str) -> tuple[str, bool]:
    declared = next(t for t in api.types if t.name == message)
    found = next(f for f in declared.fields if f.name == name)
    return found.description, found.required


def test_every_field_and_enum_value_of_the_proto_is_described() -> None:
    missing = undocumented(_api())
    assert not missing, f"agent.proto: no description for {', '.join(missing)}"


def test_the_parser_sees_every_message_field_and_enum_value() -> None:
    """Nothing the generated code has may be skipped by the parser (and so go unchecked)."""
    parsed = {(t.name, f.name) for t in _api().types for f in t.fields}
    declared = {
        (m.name, f.name) for m in pb.DESCRIPTOR.message_types_by_name.values() for f in m.fields
    }
    declared |= {
        (e.name, v.name) for e in pb.DESCRIPTOR.enum_types_by_name.values() for v in e.values
    }
    assert declared - parsed == set()


def test_undocumented_names_each_field_and_value_without_a_comment() -> None:
    assert undocumented(parse(SAMPLE)) == ["Colour.RED", "Paint.note"]


def test_leading_and_trailing_comments_are_joined_in_order() -> None:
    api = parse(SAMPLE)
    assert _field(api, "Paint", "width_mm") == ("the brush's width, millimetres", False)
    assert _field(api, "Colour", "BLUE") == ("the colour of the sky", False)
    assert _field(api, "Colour", "COLOUR_UNSPECIFIED") == ("not a colour", False)
    assert _field(api, "Paint", "colour") == ("Required. What to paint with.", True)


def test_priority_is_marked_required_in_the_reference() -> None:
    description, required = _field(_api(), "Request", "priority")
    assert required
    assert description.startswith("Required.")
    rows = [line for line in reference(PROTO.read_text()).splitlines() if "| `priority` |" in line]
    assert any("| **yes** |" in row and "`Priority`" in row for row in rows), rows


def test_the_fields_validation_requires_are_marked_required() -> None:
    api = _api()
    for message, name in [
        ("Request", "request_id"),
        ("Request", "tenant"),
        ("Request", "trust_domain"),
        ("Request", "priority"),
        ("Request", "thread_pct"),
        ("ReserveRequest", "gang_id"),
        ("GangRequest", "gang_id"),
        ("ReleaseRequest", "lease_id"),
    ]:
        assert _field(api, message, name)[1], f"{message}.{name} is not marked Required"
    assert not _field(api, "Request", "workload")[1]


def test_lease_state_lists_every_lease_state() -> None:
    from agent.core.lease import LeaseState

    description, _required = _field(_api(), "Lease", "state")
    missing = [s.value for s in LeaseState if f'"{s.value}"' not in description]
    assert not missing, f"Lease.state does not name {missing}"


def test_table_cells_escape_pipes_and_angle_brackets() -> None:
    text = reference('message M {\n  string a = 1;  // "x|y" or <z>\n}\n')
    assert '| "x\\|y" or &lt;z> |' in text
