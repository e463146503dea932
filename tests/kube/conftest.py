"""Fixtures shared by the cluster side's tests: the admission webhook served over HTTP on
loopback (tests/kube/webhook_reviews.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agent.legacy.cluster.webhook import build_webhook_app
from tests.kube.webhook_reviews import Webhook, served


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    """The webhook as ``kube serve`` builds it, and a client of it."""
    async with served(build_webhook_app()) as client:
        yield client
