"""``api``: the API stand-in with the node's Node object; ``kube``: the agent's REST client
over it, waiting ``kube_timeout_s`` for an answer (a module overrides that fixture);
``driver_settings``: what makes an agent in the test's process the node's DRA driver,
publishing to ``api``; ``agent``: such an agent on a simulated node of two 80 GiB GPUs,
with the module's ``extra_settings`` (none by default)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.runtime.app import App
from tests.dra.fixtures import (
    NODE,
    TOKEN,
    driver_overrides,
    kube,  # noqa: F401 (a fixture: importing it registers it here)
)
from tests.helpers import fake_ports, running_app, sim_settings
from tests.kubeworld.apiserver import FakeApiServer


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=TOKEN) as server:
        server.create_node(NODE)
        yield server


@pytest.fixture
def kube_timeout_s() -> float:
    return 2.0


@pytest.fixture
def driver_settings(root: Path, api: FakeApiServer) -> dict[str, object]:
    """Settings for :func:`tests.helpers.sim_settings`; the token file they name is
    written under ``root``."""
    return {**driver_overrides(root, api.url), "dra.slice_min_interval_s": 0.05}


@pytest.fixture
def extra_settings() -> dict[str, object]:
    return {}


@pytest.fixture
async def agent(
    root: Path, driver_settings: dict[str, object], extra_settings: dict[str, object]
) -> AsyncIterator[App]:
    """A simulated node of two 80 GiB GPUs (gpu-0, gpu-1), the DRA driver on; a refused
    device backs off for 30 s."""
    settings = sim_settings(
        root,
        **{
            "estimator.model_dir": "none",
            "dra.refusal_backoff_s": 30,
            **driver_settings,
            **extra_settings,
        },
    )
    async with running_app(settings, fake_ports(2)) as app:
        yield app
