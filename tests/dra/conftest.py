"""``api``: the API stand-in with the node's Node object; ``kube``: the agent's REST client
over it, waiting ``kube_timeout_s`` for an answer (a module overrides that fixture);
``driver_settings``: what makes an agent in the test's process the node's DRA driver,
publishing to ``api``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.dra.fixtures import (
    NODE,
    TOKEN,
    driver_overrides,
    kube,  # noqa: F401 (a fixture: importing it registers it here)
)
from tests.kube.apiserver import FakeApiServer


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
