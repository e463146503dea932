"""``api``: the API stand-in with the node's Node object; ``kube``: the agent's REST client
over it, waiting ``kube_timeout_s`` for an answer (a module overrides that fixture);
``driver_settings``: what makes an agent in the test's process the node's DRA driver,
publishing to ``api``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.kubeapi.rest import RestKubeApi
from tests.certs import make_token
from tests.dra.fixtures import NODE, TOKEN
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
async def kube(api: FakeApiServer, kube_timeout_s: float) -> AsyncIterator[RestKubeApi]:
    async with RestKubeApi.from_url(api.url, token=TOKEN, timeout_s=kube_timeout_s) as adapter:
        yield adapter


@pytest.fixture
def driver_settings(root: Path, api: FakeApiServer) -> dict[str, object]:
    """Settings for :func:`tests.helpers.sim_settings`; the token file they name is
    written under ``root``."""
    make_token(root / "api-token", TOKEN)
    return {
        "runtime.node_name": NODE,
        "dra.enabled": True,
        "dra.plugin_dir": str(root / "plugin"),
        "dra.registry_dir": str(root / "registry"),
        "dra.cdi_dir": str(root / "cdi"),
        "dra.api_server": api.url,
        "dra.api_token_file": str(root / "api-token"),
        "dra.slice_min_interval_s": 0.05,
    }
