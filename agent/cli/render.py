"""Plain-text tables and JSON for the CLI."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message


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
