"""The agent as an NRI plugin of the container runtime (containerd 2, CRI-O).

It connects to the runtime's NRI socket, registers as ``<index>-gpushare``, subscribes to
CreateContainer alone, and answers each with the container's adjustment: the variables,
mounts and annotations of its pod's lease. Unlike the device plugin's Allocate, the runtime
says which pod the container is for, so no bind has to wait for another. A refusal fails
the container's creation. When the runtime goes away (a restart), the plugin connects
again with backoff; :attr:`NriPlugin.registered` says whether it is serving now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from agent.legacy.deviceplugin.nri.port import Injection, InjectionRefused, Injector, PodRef
from agent.legacy.deviceplugin.nri.proto import nri_pb2 as pb
from agent.legacy.deviceplugin.nri.wire import (
    PLUGIN_CONN,
    RUNTIME_CONN,
    UNIMPLEMENTED,
    Session,
    TtrpcError,
)

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
CREATE_CONTAINER = 4  # NRI's Event enum
EVENTS = 1 << (CREATE_CONTAINER - 1)
FAILED_PRECONDITION = 9
REGISTER_TIMEOUT_S = 5.0  # the runtime's own registration timeout
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0


class NriPlugin:
    def __init__(
        self,
        socket_path: str,
        inject: Injector,
        *,
        name: str = "gpushare",
        index: str = "10",
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._socket_path = socket_path
        self._inject = inject
        self._name, self._index = name, index
        self._on_change = on_change
        self._configured = asyncio.Event()
        self.registered = False
        self.runtime = ""  # "<name> <version>" of the runtime, once configured

    async def run(self) -> None:
        """Connect, register and serve; again after every disconnection, until cancelled."""
        delay_s = RETRY_FIRST_S
        while True:
            try:
                await self._serve_once()
                delay_s = RETRY_FIRST_S
            except Exception as exc:  # any end of a session (a broken frame too): again
                where = self._socket_path
                log.warning(
                    "NRI plugin: %s: %s: %s; connecting again in %.1f s",
                    where,
                    type(exc).__name__,
                    exc,
                    delay_s,
                )
            finally:
                self._set_registered(False)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, RETRY_MAX_S)

    async def _serve_once(self) -> None:
        reader, writer = await asyncio.open_unix_connection(self._socket_path)
        session = Session(
            reader, writer, serve_conn=PLUGIN_CONN, call_conn=RUNTIME_CONN, handler=self._handle
        )
        reading = asyncio.create_task(session.run(), name="nri-session")
        try:
            self._configured.clear()
            request = pb.RegisterPluginRequest(plugin_name=self._name, plugin_idx=self._index)
            await session.call(
                RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(), REGISTER_TIMEOUT_S
            )
            async with asyncio.timeout(REGISTER_TIMEOUT_S):
                await self._configured.wait()  # configured and synchronized
            self._set_registered(True)
            log.info("NRI plugin %s-%s registered with %s", self._index, self._name, self.runtime)
            await reading
            log.warning("NRI plugin: the runtime closed the connection")
        finally:
            session.close()
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reading

    def _set_registered(self, registered: bool) -> None:
        if registered != self.registered:
            self.registered = registered
            if self._on_change is not None:
                self._on_change(registered)

    async def _handle(self, service: str, method: str, payload: bytes) -> bytes:
        if service != PLUGIN_SERVICE:
            raise TtrpcError(UNIMPLEMENTED, f"service {service}")
        if method == "Configure":
            configure = pb.ConfigureRequest.FromString(payload)
            self.runtime = f"{configure.runtime_name} {configure.runtime_version}".strip()
            return pb.ConfigureResponse(events=EVENTS).SerializeToString()
        if method == "Synchronize":  # nothing to change in the containers already there
            more = pb.SynchronizeRequest.FromString(payload).more
            if not more:  # the last part: the runtime calls this plugin from now on
                self._configured.set()
            return pb.SynchronizeResponse(more=more).SerializeToString()
        if method == "CreateContainer":
            return await self._create_container(pb.CreateContainerRequest.FromString(payload))
        if method in ("StateChange", "Shutdown"):
            return pb.Empty().SerializeToString()
        raise TtrpcError(UNIMPLEMENTED, f"method {method}")

    async def _create_container(self, request: pb.CreateContainerRequest) -> bytes:
        pod = PodRef(
            request.pod.namespace,
            request.pod.name,
            request.pod.uid,
            dict(request.pod.annotations),
        )
        try:
            injection = await self._inject(pod, request.container.name, list(request.container.env))
        except InjectionRefused as exc:
            raise TtrpcError(FAILED_PRECONDITION, str(exc)) from exc
        adjust = adjustment(injection) if injection is not None else pb.ContainerAdjustment()
        return pb.CreateContainerResponse(adjust=adjust).SerializeToString()


def adjustment(injection: Injection) -> pb.ContainerAdjustment:
    return pb.ContainerAdjustment(
        annotations=dict(injection.annotations),
        env=[pb.KeyValue(key=k, value=v) for k, v in injection.env.items()],
        mounts=[
            pb.Mount(
                destination=m.container_path,
                type="bind",
                source=m.host_path,
                options=["rbind", "ro" if m.read_only else "rw"],
            )
            for m in injection.mounts
        ],
    )
