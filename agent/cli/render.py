"""Plain-text tables and JSON for the CLI."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from agent.admission.isolation import isolation_phrase
from agent.api.proto import agent_pb2 as pb


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def message_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        unquote_int64_if_possible=True,
    )


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False)


def device_isolation(device: pb.Device) -> str:
    """The device's isolation as one line for people; an agent too old to state it says
    nothing, and that is shown."""
    if not device.HasField("isolation"):
        return "not stated by this agent"
    words = device.isolation
    return isolation_phrase(words.memory, words.faults, words.compute)


def isolation_lines(devices: Sequence[pb.Device]) -> list[str]:
    """What each device isolates between its leases: one line per sharing mode when every
    device of a mode states the same, else one line per device (by UUID)."""
    by_mode: dict[str, set[str]] = {}
    for device in devices:
        by_mode.setdefault(device.sharing_mode, set()).add(device_isolation(device))
    if all(len(phrases) == 1 for phrases in by_mode.values()):
        keyed = [(mode, phrases.pop()) for mode, phrases in by_mode.items()]
    else:
        keyed = [(d.uuid, device_isolation(d)) for d in devices]
    width = max((len(key) for key, _ in keyed), default=0)
    return [f"  {key.ljust(width)}  {phrase}" for key, phrase in keyed]
