"""What users and other systems see of the agent, in one file to diff: every command's
``--help``, every setting's key and default, the metric names and event kinds the code
emits, and the store's schema. A change of code that is meant to move code only (a new
folder, a fence) must leave it byte-identical; a change of behaviour shows here, in review.

    python -m tests.surface            # rewrite tests/data/surface.json
    python -m tests.surface --check    # exit 1, with the keys that differ, where stale
    python -m tests.surface --print    # print it

Read in a process of its own with a plain environment (``fresh``): help texts show
defaults that the environment and other code in the process can change.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "tests" / "data" / "surface.json"
HELP_WIDTH = 100
METRIC = re.compile(r"^gpushare_[a-z0-9_]+$")
WORD = r"[a-z]+(?:_[a-z]+)*"
DOTTED = re.compile(rf"^{WORD}\.{WORD}(?:\.{WORD})?$")
NOT_KINDS = ("gpushare.", "metadata.")  # the audit logger's name, Kubernetes field paths


def command_help() -> dict[str, str]:
    """``--help`` of every command and group, by its full name."""
    from agent.cli.main import cli

    found: dict[str, str] = {}

    def walk(command: click.Command, parent: click.Context | None, name: str) -> None:
        ctx = click.Context(command, info_name=name, parent=parent, terminal_width=HELP_WIDTH)
        ctx.max_content_width = HELP_WIDTH
        found[ctx.command_path] = command.get_help(ctx)
        if isinstance(command, click.Group):
            for sub in sorted(command.list_commands(ctx)):
                child = command.get_command(ctx, sub)
                if child is not None:
                    walk(child, ctx, sub)

    walk(cli, None, "gpushare")
    return found


def settings() -> dict[str, Any]:
    """Every setting's key and its default, as ``gpushare config show --resolved`` prints
    them with no file and no environment."""
    from agent.config.loading import setting_fields
    from agent.config.settings import Settings

    defaults = Settings()
    found = {}
    for key in setting_fields():
        value: Any = defaults
        for part in key.split("."):
            value = getattr(value, part)
        found[key] = (
            value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
        )
    return found


def _constants_in_calls(pattern: re.Pattern[str]) -> list[str]:
    """String constants matching ``pattern`` that the agent's code passes to a call (first
    argument or ``kind=``)."""
    found = set()
    for path in sorted((REPO / "agent").rglob("*.py")):
        if "proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            given = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "kind")]
            for arg in given:
                literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                if literal and pattern.match(arg.value):
                    found.add(arg.value)
    return sorted(found)


def metric_names() -> list[str]:
    """Every ``gpushare_*`` name the code hands a metric constructor or family."""
    return _constants_in_calls(METRIC)


def event_kinds(setting_keys: set[str]) -> list[str]:
    """Every dotted kind the code hands a call literally (the transitions' kinds,
    ``lease.<state>``, are made from the lease states and are not listed), setting keys,
    the audit logger's name and field paths aside."""
    return [
        k
        for k in _constants_in_calls(DOTTED)
        if k not in setting_keys and not k.startswith(NOT_KINDS)
    ]


def store_schema() -> list[str]:
    """The SQL of every table and index of a store created from nothing."""
    from agent.state.migrations import migrate

    db = sqlite3.connect(":memory:")
    migrate(db)
    rows = db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name")
    return [" ".join(str(sql).split()) for (sql,) in rows]


def surface() -> dict[str, Any]:
    keys = settings()
    return {
        "help": command_help(),
        "settings": keys,
        "metrics": metric_names(),
        "event_kinds": event_kinds(set(keys)),
        "store_schema": store_schema(),
    }


def render() -> str:
    return json.dumps(surface(), indent=1, sort_keys=True) + "\n"


def fresh() -> dict[str, Any]:
    """The surface as a new process with a plain environment reads it."""
    plain = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    plain["HOME"] = os.environ.get("HOME", "/root")
    done = subprocess.run(
        [sys.executable, "-m", "tests.surface", "--print"],
        cwd=REPO,
        env=plain,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The parts (``help:gpushare kube``, ``settings``, ...) that differ."""
    found = []
    for part in sorted(set(old) | set(new)):
        a, b = old.get(part), new.get(part)
        if isinstance(a, dict) and isinstance(b, dict):
            found += [f"{part}:{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            found.append(part)
    return found


def main(argv: list[str]) -> int:
    if "--print" in argv:
        sys.stdout.write(render())
        return 0
    now = json.dumps(fresh(), indent=1, sort_keys=True) + "\n"
    if "--check" in argv:
        old = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {}
        changed = differences(old, json.loads(now))
        if changed:
            print("the agent's surface changed: " + ", ".join(changed))
            return 1
        return 0
    SNAPSHOT.write_text(now)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
