"""``api``: the API stand-in; ``kube``: the controller's REST client over it, waiting
``kube_timeout_s`` for an answer (short: a status write with no answer is given up within
a test's time)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.dra.fixtures import (
    TOKEN,
    kube,  # noqa: F401 (a fixture: importing it registers it here)
)
from tests.kubeworld.apiserver import FakeApiServer


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def kube_timeout_s() -> float:
    return 1.0
