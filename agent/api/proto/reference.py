"""Write the API reference (Markdown) from ``agent.proto``: the service's RPCs with their
comments, then every message and enum with its fields and field comments.

    python -m agent.api.proto.reference > docs/api.md

A test fails when docs/api.md is not what this prints.
"""

from __future__ import annotations

import re
from pathlib import Path

PROTO = Path(__file__).with_name("agent.proto")
_RPC = re.compile(r"rpc (\w+)\((\w+)\) returns \((stream )?(\w+)\);")
_FIELD = re.compile(r"^(repeated )?(map<[^>]+>|\S+) (\w+) = (\d+);\s*(?://\s*(.*))?$")
_ENUM_VALUE = re.compile(r"^(\w+) = (\d+);\s*(?://\s*(.*))?$")


def reference(text: str) -> str:
    lines = [line.strip() for line in text.splitlines()]
    out = [
        "# API reference: `gpushare.v1.Agent`",
        "",
        "Generated from `agent/api/proto/agent.proto` by "
        "`python -m agent.api.proto.reference`; do not edit by hand.",
        "",
        "## RPCs",
        "",
        "| RPC | request | answer | what it does |",
        "|---|---|---|---|",
    ]
    comment: list[str] = []
    for line in lines:
        if line.startswith("//"):
            comment.append(line[2:].strip())
            continue
        match = _RPC.search(line)
        if match:
            name, request, stream, answer = match.groups()
            answer = f"stream of `{answer}`" if stream else f"`{answer}`"
            out.append(f"| `{name}` | `{request}` | {answer} | {' '.join(comment)} |")
        comment = []
    out += ["", "## Messages and enums", ""]
    out += _types(lines)
    return "\n".join(out) + "\n"


def _types(lines: list[str]) -> list[str]:
    out: list[str] = []
    comment: list[str] = []
    inside: str | None = None
    for line in lines:
        if line.startswith("//"):
            comment.append(line[2:].strip())
            continue
        head = re.match(r"^(message|enum) (\w+) \{(\})?$", line)
        if head:
            kind, name, closed = head.groups()
            out += [f"### {kind} `{name}`", ""]
            if comment:
                out += [" ".join(comment), ""]
            if closed:
                out += ["(no fields)", ""]
            else:
                inside = kind
                out += ["| field | type | number | meaning |", "|---|---|---|---|"]
            comment = []
            continue
        if inside and line == "}":
            out.append("")
            inside = None
        elif inside == "message" and (field := _FIELD.match(line)):
            label, kind_, name, number, note = field.groups()
            shown = f"{label or ''}{kind_}"
            out.append(f"| `{name}` | `{shown}` | {number} | {note or ''} |")
        elif inside == "enum" and (value := _ENUM_VALUE.match(line)):
            name, number, note = value.groups()
            out.append(f"| `{name}` | | {number} | {note or ''} |")
        comment = []
    return out


if __name__ == "__main__":
    print(reference(PROTO.read_text()), end="")
