"""The ``ledger`` fixture: a node over a store whose writes the test can hold or fail."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.state.races import Ledger, open_node


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    node, store, events = await open_node(tmp_path)
    yield node, store, events
    store.release()
    await store.aclose()
