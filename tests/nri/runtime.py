"""A stand-in for the NRI side of a container runtime (containerd 2, CRI-O): it listens on
the NRI socket, takes a plugin's RegisterPlugin, calls its Configure and Synchronize as
the runtime does, checks the event mask, and calls CreateContainer when told to, in NRI's
wire format (multiplexed ttrpc, :mod:`agent.legacy.deviceplugin.nri.wire`). An adjustment
is applied to the container's environment the way the runtime applies it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.legacy.deviceplugin.nri.proto import nri_pb2 as pb
from agent.legacy.deviceplugin.nri.wire import (
    MAX_MESSAGE,
    PLUGIN_CONN,
    RUNTIME_CONN,
    TTRPC_HEADER,
    UNIMPLEMENTED,
    Session,
    TtrpcError,
    frames,
)

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
VALID_EVENTS = (1 << 11) - 1  # NRI v0.8 (containerd 2.0): 11 events
CREATE_CONTAINER_BIT = 1 << 3
REQUEST_TIMEOUT_S = 2.0  # containerd's plugin_request_timeout default


@dataclass
class Created:
    env: dict[str, str]
    mounts: list[pb.Mount]
    annotations: dict[str, str]


@dataclass
class FakeNriRuntime:
    socket_path: Path
    plugins: list[str] = field(default_factory=list)  # "<idx>-<name>" registered, in order
    events_mask: int | None = None
    configured: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.base_events.Server | None = None
    _session: Session | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.socket_path))

    async def stop(self) -> None:
        """The runtime goes away (a restart): the socket closes, the plugin is gone."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self._session is not None:
            self._session.close()
            await self._session.closed.wait()
            self._session = None
        self.configured.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def break_frame(self) -> None:
        """Send the plugin a ttrpc header over the size limit: its session must end."""
        assert self._session is not None
        header = TTRPC_HEADER.pack(MAX_MESSAGE + 1, 1, 1, 0)
        self._session._writer.write(frames(PLUGIN_CONN, header))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = Session(
            reader, writer, serve_conn=RUNTIME_CONN, call_conn=PLUGIN_CONN, handler=self._handle
        )
        self._session = session
        await session.run()

    async def _handle(self, service: str, method: str, payload: bytes) -> bytes:
        if service != RUNTIME or method != "RegisterPlugin":
            raise TtrpcError(UNIMPLEMENTED, f"method {method}")
        request = pb.RegisterPluginRequest.FromString(payload)
        if not (len(request.plugin_idx) == 2 and request.plugin_idx.isdigit()):
            raise TtrpcError(3, f"invalid plugin index {request.plugin_idx!r}")
        self.plugins.append(f"{request.plugin_idx}-{request.plugin_name}")
        task = asyncio.create_task(self._configure())  # as the runtime: right after
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pb.Empty().SerializeToString()

    async def _configure(self) -> None:
        assert self._session is not None
        configure = pb.ConfigureRequest(
            runtime_name="fake-runtime",
            runtime_version="2.0",
            registration_timeout=5000,
            request_timeout=int(REQUEST_TIMEOUT_S * 1000),
        )
        answer = pb.ConfigureResponse.FromString(
            await self._session.call(
                PLUGIN, "Configure", configure.SerializeToString(), REQUEST_TIMEOUT_S
            )
        )
        if answer.events & ~VALID_EVENTS:
            self._session.close()  # the runtime refuses the plugin
            raise AssertionError(f"event mask {answer.events:#x} outside {VALID_EVENTS:#x}")
        self.events_mask = answer.events
        sync = pb.SynchronizeRequest(more=False)
        await self._session.call(PLUGIN, "Synchronize", sync.SerializeToString(), REQUEST_TIMEOUT_S)
        self.configured.set()

    async def create_container(
        self,
        pod: Mapping[str, object],
        container: str,
        env: Sequence[str],
    ) -> Created:
        """The runtime's CreateContainer with NRI: the plugin's adjustment applied to the
        container's environment; TtrpcError if the plugin refused it."""
        env_now = dict(e.partition("=")[::2] for e in env)
        if self._session is None or not self.configured.is_set():
            return Created(env_now, [], {})  # no plugin: created as it is
        assert self.events_mask is not None
        if self.events_mask and not self.events_mask & CREATE_CONTAINER_BIT:
            return Created(env_now, [], {})
        request = pb.CreateContainerRequest(
            pod=pb.PodSandbox(
                id=f"sandbox-{pod['uid']}",
                name=str(pod["name"]),
                uid=str(pod["uid"]),
                namespace=str(pod["namespace"]),
                annotations=dict(pod.get("annotations") or {}),  # type: ignore[call-overload]
            ),
            container=pb.Container(
                id=f"{pod['uid']}-{container}", name=container, env=list(env), state=1
            ),
        )
        answer = pb.CreateContainerResponse.FromString(
            await self._session.call(
                PLUGIN, "CreateContainer", request.SerializeToString(), REQUEST_TIMEOUT_S
            )
        )
        for kv in answer.adjust.env:
            if kv.key.startswith("-"):
                env_now.pop(kv.key[1:], None)
            else:
                env_now[kv.key] = kv.value
        return Created(env_now, list(answer.adjust.mounts), dict(answer.adjust.annotations))
