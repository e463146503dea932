"""The driver's kubelet plugin over its real gRPC sockets: registration, Prepare and
Unprepare answered claim by claim, the health stream, and sockets that come back."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest

from agent.dra.plugin import DraPluginError, DraPluginServer
from agent.dra.port import ClaimRef, DeviceHealth, Health, Prepared, PreparedDevice
from agent.dra.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from agent.dra.service import DraService

DEVICE = PreparedDevice(("gpu",), "node-a", "gpu-0", ("gpushare.io/claim=u1-s1",), "s1")


class RecordingDriver:
    def __init__(self) -> None:
        self.prepared: list[list[ClaimRef]] = []
        self.unprepared: list[list[ClaimRef]] = []
        self.fail = False
        self.devices = [DeviceHealth("node-a", "gpu-0", Health.HEALTHY)]

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Prepared]:
        self.prepared.append(list(claims))
        if self.fail:
            raise RuntimeError("boom")
        return {
            c.uid: Prepared(devices=(DEVICE,)) if c.name != "bad" else Prepared(error="no room")
            for c in claims
            if c.name != "silent"
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self.unprepared.append(list(claims))
        return {c.uid: "" for c in claims}

    def health(self) -> Sequence[DeviceHealth]:
        return list(self.devices)


@contextlib.asynccontextmanager
async def serving(
    root: Path, service: Callable[[RecordingDriver], DraService] = DraService, **options: float
) -> AsyncIterator[tuple[DraPluginServer, RecordingDriver]]:
    """The plugin's server, started, over a :class:`RecordingDriver`; ``options`` are the
    server's."""
    driver = RecordingDriver()
    server = DraPluginServer(
        service(driver),
        driver_name="gpushare.io",
        plugin_dir=root / "plugins" / "gpushare.io",
        registry_dir=root / "registry",
        **options,
    )
    await server.start()
    try:
        yield server, driver
    finally:
        await server.stop(0)


@pytest.fixture
async def plugin(root: Path) -> AsyncIterator[tuple[DraPluginServer, RecordingDriver]]:
    async with serving(root, functools.partial(DraService, resend_s=0.2), poll_s=0.05) as found:
        yield found


def channel(path: Path) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"unix://{path}")


async def test_registration_names_the_driver_its_socket_and_v1_first(
    plugin: tuple[DraPluginServer, RecordingDriver], root: Path
) -> None:
    server, _ = plugin
    assert server.registration_socket == root / "registry" / "gpushare.io-reg.sock"
    async with channel(server.registration_socket) as ch:
        stub = registration_pb2_grpc.RegistrationStub(ch)
        info = await stub.GetInfo(registration_pb2.InfoRequest())
        assert (info.type, info.name) == ("DRAPlugin", "gpushare.io")
        assert info.endpoint == str(root / "plugins" / "gpushare.io" / "dra.sock")
        assert list(info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        assert "v1alpha1.DRAResourceHealth" in info.supported_versions
        await stub.NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=False, error="version")
        )
        assert (server.registration.registered, server.registration.error) == (False, "version")
        await stub.NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=True)
        )
        assert server.registration.registered


@pytest.mark.parametrize(
    ("pb", "grpc_module"), [(dra_v1_pb2, dra_v1_pb2_grpc), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)]
)
async def test_each_claim_gets_its_own_answer(
    plugin: tuple[DraPluginServer, RecordingDriver], pb: object, grpc_module: object
) -> None:
    server, driver = plugin
    claims = [
        pb.Claim(namespace="ns", name=n, uid=f"u-{n}")  # type: ignore[attr-defined]
        for n in ("good", "bad", "silent")
    ]
    async with channel(server.socket_path) as ch:
        stub = grpc_module.DRAPluginStub(ch)  # type: ignore[attr-defined]
        answer = await stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims))  # type: ignore[attr-defined]
        assert set(answer.claims) == {"u-good", "u-bad", "u-silent"}
        good = answer.claims["u-good"]
        assert good.error == ""
        (device,) = good.devices
        assert (device.pool_name, device.device_name) == ("node-a", "gpu-0")
        if pb is dra_v1_pb2:  # v1beta1 has no share ids
            assert device.share_id == "s1"
        assert list(device.cdi_device_ids) == ["gpushare.io/claim=u1-s1"]
        assert answer.claims["u-bad"].error == "no room"
        assert answer.claims["u-silent"].error == "the driver gave no answer"
        driver.fail = True
        failed = await stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims[:1]))  # type: ignore[attr-defined]
        assert "failed to prepare" in failed.claims["u-good"].error
        empty = await stub.NodePrepareResources(pb.NodePrepareResourcesRequest())  # type: ignore[attr-defined]
        assert dict(empty.claims) == {}
        gone = await stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=claims[:1])
        )  # type: ignore[attr-defined]
        assert gone.claims["u-good"].error == ""
    assert [c.name for c in driver.unprepared[0]] == ["good"]


@pytest.mark.parametrize(
    ("pb", "grpc_module"),
    [(health_v1_pb2, health_v1_pb2_grpc), (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc)],
)
async def test_health_streams_the_whole_list_on_change_and_again_and_again(
    plugin: tuple[DraPluginServer, RecordingDriver], pb: object, grpc_module: object
) -> None:
    server, driver = plugin
    async with channel(server.socket_path) as ch:
        stub = grpc_module.DRAResourceHealthStub(ch)  # type: ignore[attr-defined]
        stream = stub.NodeWatchResources(pb.NodeWatchResourcesRequest())  # type: ignore[attr-defined]
        first = await stream.read()
        (told,) = first.devices
        assert (told.device.device_name, told.health) == ("gpu-0", Health.HEALTHY)
        assert told.health_check_timeout_seconds == 30 and told.last_updated_time > 0
        driver.devices = [DeviceHealth("node-a", "gpu-0", Health.UNHEALTHY, "MPS down" * 300)]
        server.service.health_changed()
        second = await asyncio.wait_for(stream.read(), 5)
        assert second.devices[0].health == Health.UNHEALTHY
        assert len(second.devices[0].message) == 1024
        third = await asyncio.wait_for(stream.read(), 5)  # resent without a change
        assert third.devices[0].health == Health.UNHEALTHY
        stream.cancel()


async def test_removed_sockets_are_served_again(
    plugin: tuple[DraPluginServer, RecordingDriver],
) -> None:
    server, _ = plugin
    server.registration_socket.unlink()
    async with asyncio.timeout(10):
        while server.restarts == 0 or not server.registration_socket.exists():
            await asyncio.sleep(0.02)
    async with channel(server.registration_socket) as ch:
        info = await registration_pb2_grpc.RegistrationStub(ch).GetInfo(
            registration_pb2.InfoRequest()
        )
    assert info.name == "gpushare.io"


async def test_stale_sockets_are_replaced_and_stop_removes_both(root: Path) -> None:
    registry = root / "registry"
    registry.mkdir()
    (registry / "gpushare.io-reg.sock").write_text("left by a killed agent")
    server = DraPluginServer(
        DraService(RecordingDriver()),
        driver_name="gpushare.io",
        plugin_dir=root / "p",
        registry_dir=registry,
    )
    await server.start()
    assert server.registration_socket.is_socket()
    await server.stop(0)
    assert not server.registration_socket.exists() and not server.socket_path.exists()


async def test_a_socket_path_too_long_for_unix_is_refused(root: Path) -> None:
    server = DraPluginServer(
        DraService(RecordingDriver()),
        driver_name="gpushare.io",
        plugin_dir=root / ("x" * 120),
        registry_dir=root,
    )
    with pytest.raises(DraPluginError, match="longer than 107 bytes"):
        await server.start()
