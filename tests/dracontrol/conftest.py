"""``api``: the API stand-in; ``kube``: the controller's REST client over it, waiting
``kube_timeout_s`` for an answer (short: a status write with no answer is given up within
a test's time)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agent.kubeapi.rest import RestKubeApi
from tests.kube.apiserver import FakeApiServer

TOKEN = "t"


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def kube_timeout_s() -> float:
    return 1.0


@pytest.fixture
async def kube(api: FakeApiServer, kube_timeout_s: float) -> AsyncIterator[RestKubeApi]:
    async with RestKubeApi.from_url(api.url, token=TOKEN, timeout_s=kube_timeout_s) as adapter:
        yield adapter
