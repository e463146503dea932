"""The node the doctor's chart tests run on: the agent of each path, in its pod."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import pytest
import yaml

from tests.e2e.doctor_chart.chart import SHARED_SHM, Node, chart_config, pod_mounts
from tests.e2e.doctor_chart.cluster import Cluster
from tests.helpers import agent_command, short_dir, subprocess_env


def _log(root: Path) -> str:
    path = root / "agent.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="package", params=["extender", "dra"])
def node(request: pytest.FixtureRequest) -> Iterator[Node]:
    """`gpushare serve --sim` with ``path``'s chart configuration, in a pod of the chart:
    started once for the tests of this folder."""
    path: str = request.param
    cluster = Cluster() if path == "dra" else None
    with short_dir() as root, cluster.running() if cluster else nullcontext():
        config = chart_config(path, root, cluster.url if cluster else "")
        (root / "config.yaml").write_text(yaml.safe_dump(config))
        for point in pod_mounts(path):  # what the pod sees of the host
            Path(f"{root}{point}").mkdir(parents=True, exist_ok=True)
        if os.path.isdir(f"{root}{SHARED_SHM}"):  # as the mps-host pod's clients need it
            os.chmod(f"{root}{SHARED_SHM}", 0o1777)
        shm_root = Path(config["mps"]["shm_root"])  # the mps-host pod makes it 0700
        shm_root.mkdir(mode=0o700, parents=True)
        command = agent_command(
            "--config", str(root / "config.yaml"), "--socket", str(root / "agent.sock"), "serve"
        )
        with open(root / "agent.log", "ab") as log:
            agent = subprocess.Popen(
                [*command, "--sim"], env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=log
            )
        try:
            deadline = time.monotonic() + 30
            while "agent ready" not in _log(root):
                assert agent.poll() is None and time.monotonic() < deadline, _log(root)[-3000:]
                time.sleep(0.1)
            yield Node(path, root, config, cluster)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
