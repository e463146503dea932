"""The agent's image, as deploy/image/build.sh builds it, for every image check."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.image.engine import BUILD, BUILD_TIMEOUT_S, TAG, engine, engine_env, run, source_digest


@pytest.fixture(scope="session")
def image() -> str:
    """``gpushare-agent:<version>``: the image .ci/run built when its gpushare.source-digest
    label matches this checkout, else built here (build.sh --reuse-base); skipped with the
    reason where no engine runs or the base cannot be made."""
    name, reason = engine()
    if name is None:
        pytest.skip(reason)
    labels = run("image", "inspect", "--format", "{{json .Labels}}", TAG)
    current = labels.returncode == 0 and (
        (json.loads(labels.stdout) or {}).get("gpushare.source-digest") == source_digest()
    )
    if not current:
        if not shutil.which("mmdebstrap"):
            pytest.skip("mmdebstrap is not installed (.ci/run installs it): cannot build the base")
        built = subprocess.run(
            ["bash", str(BUILD), "--reuse-base"],
            env=engine_env(),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        assert built.returncode == 0, f"build.sh failed:\n{(built.stdout + built.stderr)[-4000:]}"
    return TAG
