"""The DRA kubelet stand-in's plugin watcher (registration of ``*-reg.sock`` sockets, with
the kubelet's validation and backoff) and its health streams (``NodeWatchResources``)."""

from __future__ import annotations

import asyncio
import contextlib
import stat
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from agent.dra.proto import registration_pb2 as reg
from agent.dra.proto import registration_pb2_grpc as reg_grpc
from tests.kubeworld.kubelet.plugins import (
    DIAL_TIMEOUT_S,
    GET_INFO_TIMEOUT_S,
    HEALTH_NAMES,
    HEALTH_SERVICES,
    PLUGIN_TYPE,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    UNKNOWN,
    _close,
    _DeviceHealth,
    _notify,
    _Plugin,
    _Refused,
    _Retry,
    choose_service,
)


class PluginWatcher:
    """The plugin watcher and health part of :class:`DraKubelet` (its state through
    ``self``)."""

    # -- plugin watcher ----------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await self._scan()
            await asyncio.sleep(self.poll_s)

    async def _scan(self) -> None:
        present = self._registration_sockets()
        for socket, plugin in list(self._sockets.items()):
            if present.get(socket) != plugin.identity:  # deleted, or re-created
                await self._deregister(socket)
        for socket, identity in present.items():
            if socket in self._sockets or socket in self._attempts:
                continue
            if not self._due(socket, identity):
                continue
            task = asyncio.create_task(
                self._try_register(socket, identity), name=f"dra-kubelet-register-{socket.name}"
            )
            self._attempts[socket] = task

    def _registration_sockets(self) -> dict[Path, tuple[int, int]]:
        found = {}
        for path in self.registry_dir.glob("*-reg.sock"):
            with contextlib.suppress(FileNotFoundError):
                info = path.stat()
                if stat.S_ISSOCK(info.st_mode):  # bind() sets the time; a chmod does not
                    found[path] = (info.st_ino, info.st_mtime_ns)
        return found

    def _due(self, socket: Path, identity: tuple[int, int]) -> bool:
        retry = self._retries.get(socket)
        return retry is None or retry.identity != identity or time.monotonic() >= retry.at

    async def _try_register(self, socket: Path, identity: tuple[int, int]) -> None:
        try:
            await self._register(socket, identity)
        except (grpc.aio.AioRpcError, TimeoutError, _Refused):
            old = self._retries.get(socket)
            backoff_s = RETRY_FIRST_S
            if old is not None and old.identity == identity:
                backoff_s = min(old.backoff_s * 2, RETRY_MAX_S)
            self._retries[socket] = _Retry(identity, time.monotonic() + backoff_s, backoff_s)
        else:
            self._retries.pop(socket, None)
        finally:
            self._attempts.pop(socket, None)

    async def _register(self, socket: Path, identity: tuple[int, int]) -> None:
        """Dial, GetInfo, validate and add, then NotifyRegistrationStatus; the registration
        channel is closed afterwards, as the kubelet closes it."""
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            await asyncio.wait_for(channel.channel_ready(), DIAL_TIMEOUT_S)
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg.InfoRequest(), timeout=GET_INFO_TIMEOUT_S)
            if not info.endpoint:
                info.endpoint = str(socket)
            try:
                self._add(socket, identity, info, self._validate(socket, info))
            except _Refused as refused:
                self.registration_errors.append(str(refused))
                await _notify(stub, False, str(refused))
                raise
            # a failed notification leaves the plugin registered, as in the kubelet
            with contextlib.suppress(grpc.aio.AioRpcError):
                await _notify(stub, True, "")

    def _validate(self, socket: Path, info: reg.PluginInfo) -> str:
        """The service to call the plugin on, or the kubelet's refusal."""
        if info.type != PLUGIN_TYPE:
            raise _Refused(
                "RegisterPlugin error -- no handler registered for plugin type: "
                f"{info.type} at socket {socket}"
            )
        failed = "RegisterPlugin error -- plugin validation failed with err:"
        if not info.name:
            raise _Refused(f"{failed} DRA driver name is empty")
        try:
            return choose_service(list(info.supported_versions))
        except ValueError as exc:
            raise _Refused(
                f"{failed} invalid supported gRPC versions of DRA driver plugin {info.name} "
                f"at endpoint {info.endpoint}: {exc}"
            ) from None

    def _add(
        self, socket: Path, identity: tuple[int, int], info: reg.PluginInfo, service: str
    ) -> None:
        plugins = self._drivers.get(info.name, [])
        if any(p.info.endpoint == info.endpoint for p in plugins):
            raise _Refused(
                "RegisterPlugin error -- plugin registration failed with err: endpoint "
                f"{info.endpoint} already registered for DRA driver plugin {info.name}"
            )
        channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        plugin = _Plugin(socket, identity, info, service, channel)
        plugin.health_task = asyncio.create_task(
            self._watch_health(plugin), name=f"dra-kubelet-health-{info.name}"
        )
        self._drivers[info.name] = [*plugins, plugin]
        self._sockets[socket] = plugin
        self.registrations += 1

    async def _deregister(self, socket: Path) -> None:
        plugin = self._sockets.pop(socket, None)
        if plugin is None:
            return
        remaining = [p for p in self._drivers.get(plugin.driver, []) if p is not plugin]
        if remaining:
            self._drivers[plugin.driver] = remaining
        else:
            self._drivers.pop(plugin.driver, None)
        # closed in a task of its own, which a stop that cancels the watcher meanwhile
        # neither interrupts nor is swallowed by
        closing = asyncio.create_task(_close(plugin), name=f"dra-kubelet-close-{socket.name}")
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        await asyncio.wait([closing])

    # -- health --------------------------------------------------------------------------

    def health(self, driver: str) -> dict[tuple[str, str], tuple[str, str]]:
        """(pool, device) -> (Healthy | Unhealthy | Unknown, message), as of now."""
        now = self.clock()
        return {
            key: (UNKNOWN if now - h.received_at > h.timeout_s else h.status, h.message)
            for key, h in self._health.get(driver, {}).items()
        }

    async def _watch_health(self, plugin: _Plugin) -> None:
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._stream_health(plugin)
            await asyncio.sleep(self.health_retry_s)

    async def _stream_health(self, plugin: _Plugin) -> None:
        for name, (pb, stub_class) in HEALTH_SERVICES.items():
            stream = stub_class(plugin.channel).NodeWatchResources(pb.NodeWatchResourcesRequest())
            try:
                async for answer in stream:
                    plugin.health_service = name
                    self._record_health(plugin.driver, answer)
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise

    def _record_health(self, driver: str, answer: Any) -> None:
        """One full list: its devices as reported, stamped now; the others Unknown."""
        now = self.clock()
        devices = self._health.setdefault(driver, {})
        reported = set()
        for entry in answer.devices:
            key = (entry.device.pool_name, entry.device.device_name)
            timeout_s = entry.health_check_timeout_seconds
            devices[key] = _DeviceHealth(
                HEALTH_NAMES.get(entry.health, UNKNOWN),
                entry.message,
                now,
                float(timeout_s) if timeout_s > 0 else self.health_timeout_s,
            )
            reported.add(key)
        for key, known in devices.items():
            if key not in reported:
                known.status = UNKNOWN
