"""Fixtures of the kubelet tests: a fake kubelet in a short temporary directory, a
recording allocator, and a device plugin registered with that kubelet."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent.legacy.deviceplugin.kubelet.plugin import DevicePluginServer
from tests.helpers import short_dir
from tests.kubelet.recording import RecordingAllocator
from tests.kubeworld.kubelet.device_plugin import FakeKubelet, eventually


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture
async def kubelet(root: Path) -> AsyncIterator[FakeKubelet]:
    fake = FakeKubelet(root)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
def allocator() -> RecordingAllocator:
    return RecordingAllocator(["share-0", "share-1", "share-2", "share-3"])


@pytest.fixture
async def plugin(
    kubelet: FakeKubelet, allocator: RecordingAllocator
) -> AsyncIterator[DevicePluginServer]:
    server = DevicePluginServer(
        allocator, plugin_dir=kubelet.plugin_dir, poll_s=0.05, backoff_s=0.05
    )
    await server.start()
    try:
        await kubelet.wait_for(lambda: len(kubelet.healthy()) == len(allocator.ids))
        await eventually(lambda: server.registered)  # its Register call has returned
        yield server
    finally:
        await server.stop()
