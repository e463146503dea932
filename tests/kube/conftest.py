"""Fixtures shared by the cluster side's tests: the admission webhook served over HTTP on
loopback (tests/kube/webhook_reviews.py), the extender and the webhook served on a thread
of their own for the fuzz (tests/kube/http_fuzz_servers.py), and the API server stand-in
with the agent's REST adapter on it (the adapter's tests; a module may define its own)."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Iterator

import pytest

from agent.kubeapi.rest import RestKubeApi
from agent.legacy.cluster.webhook import build_webhook_app
from tests.kube.http_fuzz_servers import Servers, warm_up
from tests.kube.webhook_reviews import Webhook, served
from tests.kubeworld.apiserver import FakeApiServer

ADAPTER_TOKEN = "adapter-test-token"


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=ADAPTER_TOKEN, history=100) as server:
        yield server


@pytest.fixture
async def kube(api: FakeApiServer) -> AsyncIterator[RestKubeApi]:
    adapter = RestKubeApi.from_url(api.url, token=ADAPTER_TOKEN, timeout_s=5.0)
    try:
        yield adapter
    finally:
        await adapter.aclose()


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    """The webhook as ``kube serve`` builds it, and a client of it."""
    async with served(build_webhook_app()) as client:
        yield client


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """The cluster side's endpoints (tests/kube/http_fuzz_servers.py), started once for the
    module. The objects the test process holds by then (every module a full test run
    imported) are frozen out of the garbage collector's passes: a full collection over
    them, run by whichever thread allocates at the moment, is not a handler's cost."""
    root = logging.getLogger()
    served = Servers(tmp_path_factory.mktemp("pki"))
    level = root.level
    root.addHandler(served.log)
    root.setLevel(logging.DEBUG)
    try:
        with served.running:
            warm_up(served)
            gc.collect()
            gc.freeze()
            try:
                yield served
            finally:
                gc.unfreeze()
    finally:
        root.removeHandler(served.log)
        root.setLevel(level)
