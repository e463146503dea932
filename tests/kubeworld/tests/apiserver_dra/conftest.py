"""``api``: the API stand-in (a history of 100 changes); ``client``: a bare HTTP client of
its resource.k8s.io/v1."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.kubeworld.apiserver import (
    FakeApiServer,
)
from tests.kubeworld.tests.apiserver_dra.client import (
    Client,
)


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(history=100) as server:
        yield server


@pytest.fixture
async def client(api: FakeApiServer) -> AsyncIterator[Client]:
    async with aiohttp.ClientSession() as session:
        yield Client(session, api.url)
