"""``api``: the API stand-in (a history of 50 changes); ``raw``: a bare HTTP client of it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.kubeworld.apiserver import (
    FakeApiServer,
)
from tests.kubeworld.tests.apiserver.raw import Raw


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(history=50) as server:
        yield server


@pytest.fixture
async def raw(api: FakeApiServer) -> AsyncIterator[Raw]:
    async with aiohttp.ClientSession() as session:
        yield Raw(session, api.url)
