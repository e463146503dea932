"""Write the API reference (Markdown) from ``agent.proto``: the service's RPCs with their
comments, then every message and enum with its fields (or values) and their comments.

    python -m agent.api.proto.reference > docs/api.md

A comment belongs to the RPC, message, enum, field or enum value it precedes (the ``//``
lines right above it, no blank line between) or ends (a ``//`` comment on the same line);
a field's description is both, in that order. A field whose description starts with
"Required" is one the server refuses a request without: its table row says so. A test
fails when docs/api.md is not what this prints, and another when a field or an enum value
has no description (:func:`undocumented`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PROTO = Path(__file__).with_name("agent.proto")
REQUIRED = "Required"
_RPC = re.compile(r"^rpc (\w+)\((\w+)\) returns \((stream )?(\w+)\);\s*(?://\s*(.*))?$")
_HEAD = re.compile(r"^(message|enum) (\w+) \{(\})?\s*(?://\s*(.*))?$")
_FIELD = re.compile(r"^(repeated |optional )?(map<[^>]+>|\S+) (\w+) = (\d+);\s*(?://\s*(.*))?$")
_ENUM_VALUE = re.compile(r"^(\w+) = (\d+);\s*(?://\s*(.*))?$")


@dataclass(frozen=True, slots=True)
class Field:
    """A message field (``type`` set) or an enum value (``type`` empty)."""

    name: str
    type: str
    number: int
    description: str

    @property
    def required(self) -> bool:
        return self.description.startswith(REQUIRED)


@dataclass(frozen=True, slots=True)
class Type:
    kind: str  # "message" or "enum"
    name: str
    description: str
    fields: tuple[Field, ...] = ()


@dataclass(frozen=True, slots=True)
class Rpc:
    name: str
    request: str
    answer: str
    stream: bool
    description: str


@dataclass(frozen=True, slots=True)
class Api:
    rpcs: tuple[Rpc, ...]
    types: tuple[Type, ...]


def _described(comment: list[str], trailing: str | None) -> str:
    return " ".join([*comment, *([trailing.strip()] if trailing else [])]).strip()


def parse(text: str) -> Api:
    """The RPCs, messages and enums of ``text`` (one proto file, one declaration a line),
    each with its description. Nested messages and enums are not supported."""
    rpcs: list[Rpc] = []
    types: list[Type] = []
    comment: list[str] = []
    current: Type | None = None
    fields: list[Field] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("//"):
            comment.append(line[2:].strip())
            continue
        if rpc := _RPC.match(line):
            name, request, stream, answer, note = rpc.groups()
            rpcs.append(Rpc(name, request, answer, bool(stream), _described(comment, note)))
        elif current is None and (head := _HEAD.match(line)):
            kind, name, closed, note = head.groups()
            declared = Type(kind, name, _described(comment, note))
            if closed:
                types.append(declared)
            else:
                current, fields = declared, []
        elif current is not None and line == "}":
            types.append(Type(current.kind, current.name, current.description, tuple(fields)))
            current = None
        elif current is not None and current.kind == "message" and (field := _FIELD.match(line)):
            label, kind_, name, number, note = field.groups()
            shown = f"{label or ''}{kind_}"
            fields.append(Field(name, shown, int(number), _described(comment, note)))
        elif current is not None and current.kind == "enum" and (value := _ENUM_VALUE.match(line)):
            name, number, note = value.groups()
            fields.append(Field(name, "", int(number), _described(comment, note)))
        comment = []
    return Api(tuple(rpcs), tuple(types))


def undocumented(api: Api) -> list[str]:
    """``Message.field`` and ``Enum.VALUE`` of every field and enum value with no
    description, in file order."""
    return [f"{t.name}.{f.name}" for t in api.types for f in t.fields if not f.description]


def _cell(text: str) -> str:
    """Text for a Markdown table cell or paragraph: a ``|`` would end the cell, and a
    ``<word>`` would be taken for an HTML tag and hidden."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def _type_section(declared: Type) -> list[str]:
    out = [f"### {declared.kind} `{declared.name}`", ""]
    if declared.description:
        out += [_cell(declared.description), ""]
    if not declared.fields:
        return [*out, "(no fields)", ""]
    if declared.kind == "enum":
        out += ["| value | number | meaning |", "|---|---|---|"]
        out += [f"| `{v.name}` | {v.number} | {_cell(v.description)} |" for v in declared.fields]
        return [*out, ""]
    out += ["| field | type | number | required | meaning |", "|---|---|---|---|---|"]
    for f in declared.fields:
        required = "**yes**" if f.required else ""
        out.append(
            f"| `{f.name}` | `{f.type}` | {f.number} | {required} | {_cell(f.description)} |"
        )
    return [*out, ""]


def reference(text: str) -> str:
    api = parse(text)
    out = [
        "# API reference: `gpushare.v1.Agent`",
        "",
        "Generated from `agent/api/proto/agent.proto` by "
        "`python -m agent.api.proto.reference`; do not edit by hand.",
        "",
        'A field marked **yes** under "required" must be set: the agent answers '
        "INVALID_ARGUMENT without it. Strings left empty, numbers left 0 and `optional` "
        "fields left unset mean what each field's description says.",
        "",
        "## RPCs",
        "",
        "| RPC | request | answer | what it does |",
        "|---|---|---|---|",
    ]
    for rpc in api.rpcs:
        answer = f"stream of `{rpc.answer}`" if rpc.stream else f"`{rpc.answer}`"
        out.append(f"| `{rpc.name}` | `{rpc.request}` | {answer} | {_cell(rpc.description)} |")
    out += ["", "## Messages and enums", ""]
    for declared in api.types:
        out += _type_section(declared)
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(reference(PROTO.read_text()), end="")
