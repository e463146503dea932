"""The map in docs/architecture.md, generated: the folders' layers from the import contracts
in pyproject.toml (the one over the whole agent, top to bottom), what each folder is from
its docstring's first sentence, and the folders each one imports, read from the code (so
an arrow on the map is an import that exists, and a contract forbids every upward one);
then each folder's own layers, from its contract.

    python -m tests.architecture_map            # rewrite the map in docs/architecture.md
    python -m tests.architecture_map --check    # exit 1, saying so, where it is stale
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
BEGIN = (
    "<!-- the map: written by `python -m tests.architecture_map` from pyproject.toml's import"
    " contracts and the folders' docstrings; edit those, not this block -->"
)
END = "<!-- end of the map -->"
WIDTH = 92


def contracts() -> list[dict[str, Any]]:
    text = (REPO / "pyproject.toml").read_text()
    found: list[dict[str, Any]] = tomllib.loads(text)["tool"]["importlinter"]["contracts"]
    return found


def folder_layers(found: list[dict[str, Any]]) -> list[list[str]]:
    """The whole agent's layers, top to bottom, each a list of folders (``agent.`` off)."""
    top = next(c for c in found if c["type"] == "layers" and "agent.cli" in c["layers"])
    return [[p.strip().removeprefix("agent.") for p in row.split("|")] for row in top["layers"]]


def first_sentence(folder: str) -> str:
    """The first sentence of a folder's docstring, Sphinx roles and double backquotes
    plainly written."""
    path = REPO / "agent" / folder.replace(".", "/")
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(source.read_text())) or ""
    text = re.sub(r":\w+:`~?\.?([^`]+)`", r"\1", " ".join(doc.split()))
    text = text.replace("``", "`")
    sentence = re.split(r"(?<=[.])\s", text, maxsplit=1)[0]
    return sentence


def imports_between(folders: list[str]) -> dict[str, list[str]]:
    """For each folder, the other folders of the map its modules import (any import,
    type-only ones too), read with grimp, the graph import-linter reads."""
    import grimp

    graph = grimp.build_graph("agent", cache_dir=None)
    by_length = sorted(folders, key=len, reverse=True)

    def owner(module: str) -> str | None:
        name = module.removeprefix("agent.")
        return next((f for f in by_length if name == f or name.startswith(f + ".")), None)

    found: dict[str, set[str]] = {f: set() for f in folders}
    for module in graph.modules:
        source = owner(module)
        if source is None:
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            target = owner(imported)
            if target is not None and target != source:
                found[source].add(target)
    order = {f: i for i, f in enumerate(folders)}
    return {f: sorted(found[f], key=order.__getitem__) for f in folders}


def render_map(layers: list[list[str]], arrows: dict[str, list[str]]) -> list[str]:
    lines = ["```"]
    for at, row in enumerate(layers):
        if at:
            lines.append("  │")
        lines.append(" | ".join(row))
        for folder in row:
            label = f"{folder}: " if len(row) > 1 else ""
            lines += textwrap.wrap(
                label + first_sentence(folder),
                WIDTH,
                initial_indent="    ",
                subsequent_indent="      ",
            )
            if arrows[folder]:
                lines += textwrap.wrap(
                    ", ".join(arrows[folder]),
                    WIDTH,
                    initial_indent="    -> ",
                    subsequent_indent="       ",
                )
    lines.append("```")
    return lines


def render_inner(found: list[dict[str, Any]]) -> list[str]:
    """Each folder's own contract: its layers top to bottom (``|`` independent, ``:`` may
    import each other), or its independent parts."""
    lines = [
        "| folder | its modules, top to bottom (`\\|`: independent, `:`: may import each other) |",
        "|---|---|",
    ]
    for contract in found:
        modules = contract.get("layers") or contract.get("modules") or []
        if "agent.cli" in modules or not modules:
            continue
        names = [m for row in modules for m in re.split(r"[|:]", row)]
        prefix = _common_package([n.strip() for n in names])
        if prefix in {"agent", ""}:
            continue

        def short(row: str, cut: str = prefix + ".") -> str:
            return re.sub(r"\s+", " ", row.replace(cut, "")).replace("|", "\\|").strip()

        if contract["type"] == "layers":
            body = " > ".join(short(row) for row in modules)
        elif contract["type"] == "independence":
            body = " \\| ".join(short(m) for m in modules) + " (independent)"
        else:
            continue
        lines.append(f"| `{prefix.removeprefix('agent.')}` | {body} |")
    return lines


def _common_package(names: list[str]) -> str:
    parts = [n.split(".") for n in names]
    common = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def render() -> str:
    found = contracts()
    layers = folder_layers(found)
    arrows = imports_between([f for row in layers for f in row])
    body = [
        BEGIN,
        "",
        "Each folder, what it is (its docstring) and, after `->`, the folders it imports (read",
        "from the code). A folder imports only folders on rows below its own; folders on one",
        "row do not import each other.",
        "",
        *render_map(layers, arrows),
        "",
        "Inside a folder its modules are layered too (one contract each):",
        "",
        *render_inner(found),
        "",
        END,
    ]
    return "\n".join(body)


def updated(doc: str) -> str:
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    return doc[:start] + render() + doc[end:]


def main(argv: list[str]) -> int:
    doc = DOC.read_text()
    fresh = updated(doc)
    if "--check" in argv:
        if fresh != doc:
            print("docs/architecture.md's map is stale: python -m tests.architecture_map")
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
