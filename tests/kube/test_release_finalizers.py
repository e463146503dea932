"""`gpushare kube release-finalizers` for an uninstall: against the API stand-in, as a real
process, it removes our finalizer and only ours, and a deleted pod then goes."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from tests.certs import make_token
from tests.helpers import agent_command, subprocess_env
from tests.kubeworld.apiserver import FakeApiServer

TOKEN = "release-token"


async def run(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        agent_command("kube", "release-finalizers", *args),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_our_finalizer_goes_others_stay_and_a_deleted_pod_goes(tmp_path: Path) -> None:
    make_token(tmp_path / "token", TOKEN)
    async with FakeApiServer(token=TOKEN) as api:
        api.create_pod("share-0", "team-a", finalizers=["gpushare.io/lease"], node_name="n1")
        api.create_pod("both", "team-a", finalizers=["example.com/keep", "gpushare.io/lease"])
        api.create_pod("other", "team-a", finalizers=["example.com/keep"])
        api.delete_pod("team-a", "share-0")  # deleted: Terminating while the finalizer stays
        assert api.pod("team-a", "share-0") is not None
        access = ("--api-server", api.url, "--api-token-file", str(tmp_path / "token"))
        dry = await run(*access, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "would release the finalizer of team-a/share-0" in dry.stdout
        assert api.pod("team-a", "share-0") is not None  # changed nothing
        done = await run(*access)
        assert done.returncode == 0, done.stderr
        assert "released the finalizer of team-a/both" in done.stdout
        assert api.pod("team-a", "share-0") is None  # its deletion completed
        assert api.pod("team-a", "both")["metadata"]["finalizers"] == ["example.com/keep"]  # type: ignore[index]
        assert api.pod("team-a", "other")["metadata"]["finalizers"] == ["example.com/keep"]  # type: ignore[index]
        again = await run(*access)
        assert "no pod holds the gpushare.io/lease finalizer" in again.stdout


async def test_usage_errors_exit_2() -> None:
    result = await run("--api-token-file", "/etc/hostname")
    assert result.returncode == 2 and "go with --api-server" in result.stderr
