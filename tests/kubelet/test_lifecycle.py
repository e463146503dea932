"""The plugin's life beside the kubelet's: a stale socket replaced, registration retried,
registering again after a kubelet restart, and stopping."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest

from agent.kubelet.sockets import file_id
from agent.legacy.deviceplugin.kubelet.plugin import DevicePluginError, DevicePluginServer
from tests.kubelet.recording import RecordingAllocator
from tests.kubeworld.kubelet.device_plugin import HEALTHY, UNHEALTHY, FakeKubelet, eventually

IDS = ["share-0", "share-1", "share-2", "share-3"]


def quick(kubelet: FakeKubelet, allocator: RecordingAllocator) -> DevicePluginServer:
    return DevicePluginServer(
        allocator, plugin_dir=kubelet.plugin_dir, poll_s=0.05, backoff_s=0.05, backoff_max_s=0.2
    )


def all_healthy(kubelet: FakeKubelet) -> bool:
    return kubelet.devices() == dict.fromkeys(IDS, HEALTHY)


def stale_socket(path: Path) -> None:
    """What a killed plugin leaves: a socket file that nobody serves."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


@pytest.mark.parametrize("leftover", ["socket", "file"])
async def test_a_stale_plugin_socket_is_replaced(
    kubelet: FakeKubelet, allocator: RecordingAllocator, leftover: str
) -> None:
    path = kubelet.plugin_dir / "gpushare.sock"
    if leftover == "socket":
        stale_socket(path)
    else:
        path.write_text("left behind")
    stale = file_id(path)
    plugin = quick(kubelet, allocator)
    await plugin.start()
    try:
        await kubelet.wait_for(lambda: all_healthy(kubelet))
        assert path.is_socket()
        assert file_id(path) != stale
        outcome = await kubelet.allocate("team-a", "p", "main", 1)  # the kubelet reaches it
        assert outcome.error is None
    finally:
        await plugin.stop()


async def test_a_directory_at_the_socket_path_is_an_error(
    kubelet: FakeKubelet, allocator: RecordingAllocator
) -> None:
    (kubelet.plugin_dir / "gpushare.sock").mkdir()
    plugin = quick(kubelet, allocator)
    with pytest.raises(DevicePluginError, match="a directory"):
        await plugin.start()
    await plugin.stop()


async def test_registers_again_after_a_kubelet_restart(
    kubelet: FakeKubelet, plugin: DevicePluginServer, allocator: RecordingAllocator
) -> None:
    first = file_id(plugin.socket_path)
    await kubelet.restart()  # our socket is removed too, as the kubelet does
    assert not kubelet.plugins
    assert not plugin.socket_path.exists()
    await kubelet.wait_for(lambda: len(kubelet.register_requests) == 2 and all_healthy(kubelet))
    assert plugin.socket_path.is_socket()
    assert file_id(plugin.socket_path) != first
    await eventually(lambda: plugin.registered)
    outcome = await kubelet.allocate("team-a", "after-restart", "main", 1)
    assert outcome.error is None
    assert allocator.allocated == [outcome.device_ids]


async def test_registers_again_when_only_the_kubelet_socket_is_new(
    kubelet: FakeKubelet, plugin: DevicePluginServer
) -> None:
    first = file_id(plugin.socket_path)
    await kubelet.restart(wipe_plugin_sockets=False)
    await kubelet.wait_for(lambda: len(kubelet.register_requests) == 2 and all_healthy(kubelet))
    assert file_id(plugin.socket_path) == first  # served all along, not re-created
    await eventually(lambda: plugin.registrations == 2)
    await kubelet.restart(wipe_plugin_sockets=False)
    await kubelet.wait_for(lambda: len(kubelet.register_requests) == 3 and all_healthy(kubelet))
    await eventually(lambda: plugin.registrations == 3 and plugin.registered)


async def test_a_refused_registration_is_retried_and_logged(
    kubelet: FakeKubelet, allocator: RecordingAllocator, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.refuse_registrations = 2
    plugin = quick(kubelet, allocator)
    with caplog.at_level(logging.WARNING, logger="agent.legacy.deviceplugin.kubelet"):
        await plugin.start()  # does not raise
        try:
            assert not plugin.registered
            await kubelet.wait_for(lambda: all_healthy(kubelet))
            assert len(kubelet.register_requests) == 3
            await eventually(lambda: plugin.registered)
        finally:
            await plugin.stop()
    failures = [r for r in caplog.records if "registering with the kubelet" in r.getMessage()]
    assert len(failures) == 2
    assert "UNAVAILABLE: the kubelet is not ready" in failures[0].getMessage()


async def test_registers_once_a_kubelet_appears(root: Path, allocator: RecordingAllocator) -> None:
    kubelet = FakeKubelet(root)  # its directories, no kubelet serving yet
    plugin = quick(kubelet, allocator)
    await plugin.start()
    try:
        assert plugin.socket_path.is_socket()
        assert not plugin.registered
        await kubelet.start()
        try:
            await kubelet.wait_for(lambda: all_healthy(kubelet))
            await eventually(lambda: plugin.registered)
        finally:
            await kubelet.stop()
    finally:
        await plugin.stop()


async def test_stop_ends_the_stream_and_removes_the_socket(
    kubelet: FakeKubelet, allocator: RecordingAllocator
) -> None:
    plugin = quick(kubelet, allocator)
    await plugin.start()
    await kubelet.wait_for(lambda: all_healthy(kubelet))
    # the open ListAndWatch stream ends at once: it does not hold the stop for its grace
    await asyncio.wait_for(plugin.stop(grace_s=30), 5)
    await kubelet.wait_for(lambda: kubelet.devices() == dict.fromkeys(IDS, UNHEALTHY))
    assert not plugin.socket_path.exists()
    assert not plugin.registered


async def test_start_twice_is_an_error(plugin: DevicePluginServer) -> None:
    with pytest.raises(RuntimeError, match="already started"):
        await plugin.start()
