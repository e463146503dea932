"""The DRA kubelet stand-in's vocabulary: the services it speaks, its timeouts, its errors,
what it records of each call and each plugin, and the reading of the plugins' answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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

PLUGIN_TYPE = "DRAPlugin"
# the DRAPlugin services this kubelet speaks, as GetInfo's supported_versions names them
SERVICES: dict[str, tuple[ModuleType, Any]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub),
}
HEALTH_SERVICES: dict[str, tuple[ModuleType, Any]] = {  # tried in this order
    "v1.DRAResourceHealth": (health_v1_pb2, health_v1_pb2_grpc.DRAResourceHealthStub),
    "v1alpha1.DRAResourceHealth": (
        health_v1alpha1_pb2,
        health_v1alpha1_pb2_grpc.DRAResourceHealthStub,
    ),
}
DIAL_TIMEOUT_S = 10.0
GET_INFO_TIMEOUT_S = 1.0
NOTIFY_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 45.0
HEALTH_TIMEOUT_S = 30.0
HEALTH_RETRY_S = 5.0
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 122.0  # the kubelet's operation backoff
DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
UNKNOWN, HEALTHY, UNHEALTHY = "Unknown", "Healthy", "Unhealthy"
HEALTH_NAMES = {0: UNKNOWN, 1: HEALTHY, 2: UNHEALTHY}


class DraKubeletError(Exception):
    """The kubelet stand-in cannot do what was asked."""


class PodStartError(DraKubeletError):
    """The pod's claims could not be prepared (the kubelet's FailedPrepareDynamicResources):
    none of its containers starts."""


class CdiError(DraKubeletError):
    """The runtime could not inject a container's CDI devices."""


class _Refused(DraKubeletError):
    """A registration refused: the text sent in NotifyRegistrationStatus(false)."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a NodePrepareResources answer."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    driver: str = ""

    def serves(self, request: str | None) -> bool:
        """Whether a container that references ``request`` (None: the whole claim) gets it;
        a device with no request names serves every request."""
        return request is None or not self.request_names or request in self.request_names


ClaimResult = list[PreparedDevice] | str  # the devices, or the claim's error


@dataclass(frozen=True)
class Retry:
    """How the kubelet tries a failed Prepare or Unprepare again: after ``first_s``,
    doubling up to ``max_s``, until ``deadline_s`` after the first try."""

    first_s: float = 0.1
    max_s: float = 1.0
    deadline_s: float = 60.0


@dataclass(frozen=True)
class Call:
    """One NodePrepareResources or NodeUnprepareResources sent to a driver (or not sent:
    the driver is not registered, the error says so)."""

    method: str
    driver: str
    errors: dict[str, str]  # claim uid -> its error, "" = done

    @property
    def failed(self) -> dict[str, str]:
        return {uid: error for uid, error in self.errors.items() if error}


@dataclass
class FakeContainer:
    """A container as the runtime created it; ``error`` is its CreateContainerError ("" when
    it started)."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Obj] = field(default_factory=list)
    device_nodes: list[Obj] = field(default_factory=list)
    cdi_ids: list[str] = field(default_factory=list)
    error: str = ""


@dataclass(eq=False)
class _Plugin:
    socket: Path
    identity: tuple[int, int]
    info: reg.PluginInfo
    service: str
    channel: grpc.aio.Channel
    health_service: str = ""
    health_task: asyncio.Task[None] | None = None

    @property
    def driver(self) -> str:
        return str(self.info.name)


@dataclass
class _Retry:
    identity: tuple[int, int]
    at: float
    backoff_s: float


@dataclass
class _DeviceHealth:
    status: str
    message: str
    received_at: float
    timeout_s: float


@dataclass
class _ClaimRecord:
    claim: Obj
    pods: set[str] = field(default_factory=set)
    devices: list[PreparedDevice] | None = None  # set once prepared


def claim_key(claim: Obj) -> tuple[str, str, str]:
    """``(namespace, uid, name)`` of a ResourceClaim object."""
    meta = claim["metadata"]
    return meta.get("namespace", "default"), meta["uid"], meta["name"]


def claim_drivers(claim: Obj) -> list[str]:
    """The drivers named in the claim's allocation results, in order."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return list(dict.fromkeys(r["driver"] for r in results))


def choose_service(versions: Sequence[str]) -> str:
    """The first listed service the kubelet speaks, or ValueError with the kubelet's words."""
    if not versions:
        raise ValueError("empty list of supported gRPC services (aka supported versions)")
    for version in versions:
        if version in SERVICES:
            return version
    raise ValueError(
        f"none of services supported by the plugin ({_go_quote(versions)}) "
        f"are supported by the kubelet ({_go_quote(SERVICES)})"
    )


def _go_quote(items: Iterable[str]) -> str:
    return "[" + " ".join(json.dumps(item) for item in items) + "]"


async def _close(plugin: _Plugin) -> None:
    if plugin.health_task is not None:
        plugin.health_task.cancel()
        await asyncio.wait([plugin.health_task])
    await plugin.channel.close(grace=None)


async def _notify(stub: reg_grpc.RegistrationStub, registered: bool, error: str) -> None:
    status = reg.RegistrationStatus(plugin_registered=registered, error=error)
    await stub.NotifyRegistrationStatus(status, timeout=NOTIFY_TIMEOUT_S)


def _call_error(method: str, exc: Exception) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{method} failed: {exc.code().name}: {exc.details()}"
    return str(exc)


def _prepared(driver: str, answer: Any) -> ClaimResult:
    if answer is None:
        return "NodePrepareResources left the claim out of its answer"
    if answer.error:
        return str(answer.error)
    return [
        PreparedDevice(
            request_names=tuple(d.request_names),
            pool_name=d.pool_name,
            device_name=d.device_name,
            cdi_device_ids=tuple(d.cdi_device_ids),
            share_id=_share_id(d),
            driver=driver,
        )
        for d in answer.devices
    ]


def _share_id(device: Any) -> str | None:
    """The optional ``share_id`` (v1 only: v1beta1 has no such field)."""
    if "share_id" not in device.DESCRIPTOR.fields_by_name or not device.HasField("share_id"):
        return None
    return str(device.share_id)


def _claim_name(pod: Obj, entry: Obj) -> str | None:
    """The ResourceClaim a pod's claim entry names: directly, or (from a template) through
    ``status.resourceClaimStatuses``; None when the pod needs no claim for it."""
    if entry.get("resourceClaimName"):
        return str(entry["resourceClaimName"])
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    for status in statuses:
        if status.get("name") == entry["name"]:
            return status.get("resourceClaimName") or None
    meta = pod["metadata"]
    raise PodStartError(
        f"pod {meta.get('namespace', 'default')}/{meta['name']}: the ResourceClaim of "
        f"pod claim {entry['name']} has not been created yet"
    )


def _spec_env(container: Obj) -> dict[str, str]:
    return {
        e["name"]: str(e.get("value", ""))
        for e in container.get("env") or []
        if "valueFrom" not in e
    }
