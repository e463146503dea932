"""The legacy fence at run time (the import-linter contracts hold it in the code): the CLI
and the agent's composition root load none of ``agent.legacy`` until a legacy command runs
or the device plugin is enabled, so a node on the DRA path never imports it."""

from __future__ import annotations

import subprocess
import sys

LOADED = "import sys; print(sorted(m for m in sys.modules if m.startswith('agent.legacy')))"

NO_LEGACY_COMMAND = """
from click.testing import CliRunner
import agent.runtime.app
from agent.cli.main import cli
for args in (["--help"], ["kube", "serve", "--help"], ["kube", "wait-rollout", "--help"]):
    assert CliRunner().invoke(cli, args).exit_code == 0, args
"""

RELEASE_FINALIZERS = """
import asyncio
from types import SimpleNamespace
from agent.cli.kube import _release_finalizers

class NoPods:
    async def __aenter__(self): return self
    async def __aexit__(self, *exc): return None
    async def list_pods(self): return SimpleNamespace(items=[])

assert asyncio.run(_release_finalizers(NoPods(), dry_run=True)) == 0
"""


def legacy_modules_after(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{LOADED}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def test_nothing_of_the_fence_is_loaded_before_it_is_used() -> None:
    assert legacy_modules_after(NO_LEGACY_COMMAND) == "[]"


def test_a_legacy_command_loads_its_own_side_only() -> None:
    loaded = legacy_modules_after(RELEASE_FINALIZERS)
    assert "'agent.legacy.cluster.finalizer'" in loaded
    assert "agent.legacy.deviceplugin" not in loaded
