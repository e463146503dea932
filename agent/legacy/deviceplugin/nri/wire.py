"""NRI's wire: ttrpc messages carried over two logical connections of one Unix socket.

The socket is multiplexed (NRI's ``pkg/net/multiplex``): each frame is a big-endian
``uint32`` connection id and ``uint32`` payload length, then the payload. Connection 1
carries the plugin's service (the runtime calls it), connection 2 the runtime's service
(the plugin calls it). Each connection is a byte stream of ttrpc messages: a big-endian
header (``uint32`` length, ``uint32`` stream id, ``uint8`` type, ``uint8`` flags), then a
``ttrpc.Request`` or ``ttrpc.Response``. A client numbers its calls 1, 3, 5, ...; the
answer comes on the same stream id. A message is sent in frames of at most 4096 bytes, the
read buffer of the Go side, and never two messages in one frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.legacy.deviceplugin.nri.proto import ttrpc_pb2

log = logging.getLogger(__name__)

MUX_HEADER = struct.Struct(">II")  # connection id, payload length
TTRPC_HEADER = struct.Struct(">IIBB")  # payload length, stream id, type, flags
PLUGIN_CONN = 1  # the plugin serves, the runtime calls
RUNTIME_CONN = 2  # the runtime serves, the plugin calls
REQUEST, RESPONSE = 1, 2
MAX_FRAME = 4096
MAX_MESSAGE = 4 << 20
UNIMPLEMENTED, INTERNAL, DEADLINE_EXCEEDED = 12, 13, 4

# (service, method, payload) -> the answer's payload; raise TtrpcError to refuse
Handler = Callable[[str, str, bytes], Awaitable[bytes]]


class TtrpcError(Exception):
    """A call answered with a non-zero status, or refused by a handler."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"ttrpc status {code}: {message}")
        self.code = code
        self.message = message


class WireError(Exception):
    """The peer broke the framing: the session cannot go on."""


def frames(conn_id: int, message: bytes) -> bytes:
    """``message`` as frames of at most :data:`MAX_FRAME` payload bytes on ``conn_id``."""
    out = bytearray()
    for at in range(0, len(message), MAX_FRAME):
        chunk = message[at : at + MAX_FRAME]
        out += MUX_HEADER.pack(conn_id, len(chunk)) + chunk
    return bytes(out)


def ttrpc_message(stream_id: int, kind: int, payload: bytes) -> bytes:
    if len(payload) > MAX_MESSAGE:
        raise WireError(f"a ttrpc message of {len(payload)} bytes is over {MAX_MESSAGE}")
    return TTRPC_HEADER.pack(len(payload), stream_id, kind, 0) + payload


@dataclass(frozen=True, slots=True)
class Message:
    stream_id: int
    kind: int
    payload: bytes


class StreamParser:
    """Bytes in, whole messages out: a parser for the frames of the socket (``mux``) or the
    ttrpc messages of one connection."""

    def __init__(self, header: struct.Struct, length_at: int, limit: int) -> None:
        self._header = header
        self._length_at = length_at  # which field of the header is the payload's length
        self._limit = limit
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[tuple[int, ...], bytes]]:
        self._buffer += data
        found = []
        while len(self._buffer) >= self._header.size:
            fields = self._header.unpack_from(self._buffer)
            length = fields[self._length_at]
            if length > self._limit:
                raise WireError(f"a message of {length} bytes is over {self._limit}")
            end = self._header.size + length
            if len(self._buffer) < end:
                break
            found.append((fields, bytes(self._buffer[self._header.size : end])))
            del self._buffer[:end]
        return found


def mux_parser() -> StreamParser:
    """The socket's frames: (connection id, length), then the payload."""
    return StreamParser(MUX_HEADER, 1, MAX_FRAME + MAX_MESSAGE)


def ttrpc_parser() -> StreamParser:
    """One connection's ttrpc messages: (length, stream id, type, flags), then the body."""
    return StreamParser(TTRPC_HEADER, 0, MAX_MESSAGE)


class Session:
    """One NRI connection: serves ``handler`` on ``serve_conn`` and calls the peer on
    ``call_conn`` (the plugin serves connection 1 and calls on 2; the runtime the other
    way round)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        serve_conn: int,
        call_conn: int,
        handler: Handler,
    ) -> None:
        self._reader, self._writer = reader, writer
        self._serve_conn, self._call_conn = serve_conn, call_conn
        self._handler = handler
        self._mux = mux_parser()
        self._conns = {c: ttrpc_parser() for c in (serve_conn, call_conn)}
        self._streams = itertools.count(1, 2)
        self._calls: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        self._handling: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()

    async def run(self) -> None:
        """Read until the peer closes; answer its calls, hand out the answers to ours."""
        try:
            while data := await self._reader.read(65536):
                for (conn_id, _length), payload in self._mux.feed(data):
                    self._received(conn_id, payload)
        finally:
            self.closed.set()
            for future in self._calls.values():
                if not future.done():
                    future.set_exception(ConnectionError("the NRI connection closed"))
            for task in list(self._handling):
                task.cancel()
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()

    async def call(self, service: str, method: str, payload: bytes, timeout_s: float) -> bytes:
        """One unary call to the peer; its answer's payload, or TtrpcError."""
        stream_id = next(self._streams)
        request = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=payload,
            timeout_nano=int(timeout_s * 1e9),
        )
        future = asyncio.get_running_loop().create_future()
        self._calls[stream_id] = future
        try:
            self._send(self._call_conn, stream_id, REQUEST, request.SerializeToString())
            async with asyncio.timeout(timeout_s):
                response: ttrpc_pb2.Response = await future
        finally:
            self._calls.pop(stream_id, None)
        if response.status.code:
            raise TtrpcError(response.status.code, response.status.message)
        return response.payload

    def close(self) -> None:
        self._writer.close()

    def _received(self, conn_id: int, payload: bytes) -> None:
        parser = self._conns.get(conn_id)
        if parser is None:
            return  # a connection nobody opened: dropped, as NRI's multiplexer does
        for (_length, stream_id, kind, _flags), body in parser.feed(payload):
            self._dispatch(conn_id, Message(stream_id, kind, body))

    def _dispatch(self, conn_id: int, message: Message) -> None:
        if conn_id == self._call_conn and message.kind == RESPONSE:
            future = self._calls.get(message.stream_id)
            if future is not None and not future.done():
                future.set_result(ttrpc_pb2.Response.FromString(message.payload))
        elif conn_id == self._serve_conn and message.kind == REQUEST:
            task = asyncio.create_task(self._answer(message))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)

    async def _answer(self, message: Message) -> None:
        response = ttrpc_pb2.Response()
        try:
            request = ttrpc_pb2.Request.FromString(message.payload)
            response.payload = await self._handler(request.service, request.method, request.payload)
        except TtrpcError as exc:
            response.status.code, response.status.message = exc.code, exc.message
        except Exception as exc:  # a bug answers INTERNAL, never kills the session
            log.exception("NRI call on stream %d failed", message.stream_id)
            response.status.code, response.status.message = INTERNAL, str(exc)
        with contextlib.suppress(ConnectionError):  # the peer went: nobody to answer
            self._send(self._serve_conn, message.stream_id, RESPONSE, response.SerializeToString())

    def _send(self, conn_id: int, stream_id: int, kind: int, payload: bytes) -> None:
        if self._writer.is_closing():
            raise ConnectionError("the NRI connection is closed")
        self._writer.write(frames(conn_id, ttrpc_message(stream_id, kind, payload)))
