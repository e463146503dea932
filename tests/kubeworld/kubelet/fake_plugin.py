"""A small fake DRA kubelet plugin (the driver's side: registration, DRAPlugin v1 and
v1beta1, resource health), served on Unix sockets, that records what it was asked and
answers as told; and the claims, pods and CDI specs the kubelet stand-in's tests send it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import grpc.aio

from agent.dra.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from agent.dra.proto import registration_pb2 as reg
from agent.dra.proto import registration_pb2_grpc as reg_grpc

Obj = dict[str, Any]
DRIVER = "gpushare.io"
KIND = "gpushare.io/claim"
NODE = "node-a"
NS = "team-a"
BOTH = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
DRA_SERVICES = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
HEALTH_SERVICES = {
    "v1": (health_v1_pb2, health_v1_pb2_grpc),
    "v1alpha1": (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
}
HEALTHY, UNHEALTHY = 1, 2


# -- a fake DRA kubelet plugin -------------------------------------------------------------


class FakeDraPlugin:
    """Registration on ``<registry>/<name>-reg.sock``; DRAPlugin (the versions listed) and
    NodeWatchResources on ``<plugin dir>/dra.sock``. Each claim is answered with
    ``devices[uid]`` (default: request ``gpu``, device ``gpu-0``, one CDI id), or with
    ``prepare_errors[uid]``; health lists are pushed with :meth:`send_health`."""

    def __init__(
        self,
        root: Path,
        *,
        plugin_type: str = "DRAPlugin",
        name: str = DRIVER,
        versions: Sequence[str] = BOTH,
        health: Sequence[str] = ("v1", "v1alpha1"),
        reg_name: str = DRIVER,
        serve_dra: bool = True,
    ) -> None:
        (root / "registry").mkdir(exist_ok=True)
        (root / "plugin").mkdir(exist_ok=True)
        self.reg_socket = root / "registry" / f"{reg_name}-reg.sock"
        self.dra_socket = root / "plugin" / "dra.sock"
        self.info = reg.PluginInfo(
            type=plugin_type,
            name=name,
            endpoint=str(self.dra_socket),
            supported_versions=list(versions),
        )
        self.serve_dra = serve_dra
        self.health_versions = list(health)
        self.statuses: list[reg.RegistrationStatus] = []
        self.calls: list[tuple[str, str, list[str]]] = []  # (service, method, claim uids)
        self.devices: dict[str, list[Obj]] = {}
        self.prepare_errors: dict[str, str] = {}
        self.unprepare_errors: dict[str, str] = {}
        self.health_streams: list[asyncio.Queue[list[Obj] | None]] = []
        self.health_opened = 0
        self._registration: grpc.aio.Server | None = None
        self._dra: grpc.aio.Server | None = None

    async def start(self) -> None:
        if self.serve_dra:
            self._dra = await self._serve(self.dra_socket, self._add_dra_services)
        await self.start_registration()

    async def start_registration(self) -> None:
        self._registration = await self._serve(
            self.reg_socket,
            lambda server: reg_grpc.add_RegistrationServicer_to_server(Registration(self), server),
        )

    async def stop_registration(self) -> None:
        if self._registration is not None:
            await self._registration.stop(0)
            self._registration = None
        self.reg_socket.unlink(missing_ok=True)

    async def stop(self) -> None:
        await self.stop_registration()
        if self._dra is not None:
            await self._dra.stop(0)
            self._dra = None

    async def _serve(self, socket: Path, add: Any) -> grpc.aio.Server:
        server = grpc.aio.server()
        add(server)
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        return server

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        for version in self.info.supported_versions:
            if version in DRA_SERVICES:
                pb, pb_grpc = DRA_SERVICES[version]
                pb_grpc.add_DRAPluginServicer_to_server(DraService(self, pb, version), server)
        for version in self.health_versions:
            pb, pb_grpc = HEALTH_SERVICES[version]
            pb_grpc.add_DRAResourceHealthServicer_to_server(HealthService(self, pb), server)

    def send_health(self, devices: list[Obj]) -> None:
        """Push a full list, entries {device, health, message?, timeout_s?}, to every stream."""
        for queue in self.health_streams:
            queue.put_nowait(devices)

    def end_health_streams(self) -> None:
        for queue in self.health_streams:
            queue.put_nowait(None)

    def prepare_answer(self, pb: ModuleType, request: Any) -> Any:
        answer = pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            result = answer.claims[claim.uid]
            if claim.uid in self.prepare_errors:
                result.error = self.prepare_errors[claim.uid]
                continue
            default = {"request_names": ["gpu"], "device": "gpu-0"}
            for device in self.devices.get(claim.uid, [default]):
                answered = result.devices.add(
                    request_names=device["request_names"],
                    pool_name=NODE,
                    device_name=device["device"],
                    cdi_device_ids=device.get("cdi", [f"{KIND}={claim.uid}-{device['device']}"]),
                )
                if "share_id" in device:  # v1 only
                    answered.share_id = device["share_id"]
        return answer


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: FakeDraPlugin) -> None:
        self.plugin = plugin

    async def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return self.plugin.info

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        self.plugin.statuses.append(request)
        return reg.RegistrationStatusResponse()


class DraService:
    def __init__(self, plugin: FakeDraPlugin, pb: ModuleType, version: str) -> None:
        self.plugin, self.pb, self.version = plugin, pb, version

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        uids = [c.uid for c in request.claims]
        self.plugin.calls.append((self.version, "NodePrepareResources", uids))
        return self.plugin.prepare_answer(self.pb, request)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        uids = [c.uid for c in request.claims]
        self.plugin.calls.append((self.version, "NodeUnprepareResources", uids))
        answer = self.pb.NodeUnprepareResourcesResponse()
        for uid in uids:
            answer.claims[uid].error = self.plugin.unprepare_errors.get(uid, "")
        return answer


class HealthService:
    def __init__(self, plugin: FakeDraPlugin, pb: ModuleType) -> None:
        self.plugin, self.pb = plugin, pb

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        queue: asyncio.Queue[list[Obj] | None] = asyncio.Queue()
        self.plugin.health_streams.append(queue)
        self.plugin.health_opened += 1
        try:
            while (devices := await queue.get()) is not None:
                yield self.pb.NodeWatchResourcesResponse(devices=[self._entry(d) for d in devices])
        finally:
            self.plugin.health_streams.remove(queue)

    def _entry(self, device: Obj) -> Any:
        return self.pb.DeviceHealth(
            device=self.pb.DeviceIdentifier(pool_name=NODE, device_name=device["device"]),
            health=device["health"],
            message=device.get("message", ""),
            health_check_timeout_seconds=device.get("timeout_s", 0),
            last_updated_time=1_800_000_000,
        )


# -- objects and fixtures ------------------------------------------------------------------


def make_claim(
    name: str, uid: str, *, drivers: Sequence[str] = (DRIVER,), reserved_for: Sequence[str] = ()
) -> Obj:
    results = [{"driver": d, "pool": NODE, "device": "gpu-0", "request": "gpu"} for d in drivers]
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": p, "uid": p} for p in reserved_for],
        },
    }


def make_pod(uid: str, claims: dict[str, Obj], containers: dict[str, list[Obj]]) -> Obj:
    """``claims``: pod claim entry name -> {resourceClaimName | resourceClaimTemplateName};
    ``containers``: name -> its ``resources.claims`` references."""
    return {
        "metadata": {"name": f"pod-{uid}", "namespace": NS, "uid": uid},
        "spec": {
            "resourceClaims": [{"name": n, **ref} for n, ref in claims.items()],
            "containers": [
                {"name": n, "env": [{"name": "FROM_POD", "value": "1"}], "resources": {"claims": r}}
                for n, r in containers.items()
            ],
        },
    }


def write_spec(directory: Path, file_name: str, devices: list[Obj], **spec: Any) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    body = {"cdiVersion": "0.5.0", "kind": KIND, "devices": devices, **spec}
    (directory / file_name).write_text(json.dumps(body))


def cdi_device(name: str, *env: str, **edits: Any) -> Obj:
    return {"name": name, "containerEdits": {"env": list(env), **edits}}
