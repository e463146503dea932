"""NRI's wire: multiplexer frames of at most 4096 bytes, never two messages in one frame,
ttrpc messages reassembled from any split of the byte stream, and a session that answers
an unknown method as Unimplemented and a handler's bug as Internal without ending."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.legacy.deviceplugin.nri.proto import ttrpc_pb2
from agent.legacy.deviceplugin.nri.proto.generate import MODULES, generate
from agent.legacy.deviceplugin.nri.wire import (
    MAX_FRAME,
    MUX_HEADER,
    TTRPC_HEADER,
    Session,
    StreamParser,
    TtrpcError,
    WireError,
    frames,
    mux_parser,
    ttrpc_message,
    ttrpc_parser,
)
from tests.helpers import REPO


def split_frames(data: bytes) -> list[tuple[int, bytes]]:
    out, at = [], 0
    while at < len(data):
        conn, length = MUX_HEADER.unpack_from(data, at)
        out.append((conn, data[at + 8 : at + 8 + length]))
        at += 8 + length
    return out


@pytest.mark.parametrize("size", [0, 1, 4086, 4096, 4097, 10_000, 3 * 4096])
def test_a_message_goes_in_frames_of_at_most_4096_bytes(size: int) -> None:
    message = ttrpc_message(1, 1, bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    parts = split_frames(frames(2, message))
    assert all(conn == 2 and 0 < len(p) <= MAX_FRAME for conn, p in parts)
    assert b"".join(p for _c, p in parts) == message


@given(
    payloads=st.lists(st.binary(max_size=9000), min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=1, max_value=5000), max_size=20),
)
def test_messages_come_out_whole_whatever_the_reads(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frames(1, ttrpc_message(2 * i + 1, 2, p)) for i, p in enumerate(payloads))
    mux, conn = mux_parser(), ttrpc_parser()
    got: list[tuple[int, bytes]] = []
    at = 0
    for cut in [*cuts, len(stream)]:
        chunk, at = stream[at : at + cut], at + cut
        for (_conn_id, _n), payload in mux.feed(chunk):
            got += [(fields[1], body) for fields, body in conn.feed(payload)]
    assert got == [(2 * i + 1, p) for i, p in enumerate(payloads)]


def test_a_message_over_the_limit_breaks_the_session() -> None:
    with pytest.raises(WireError):
        StreamParser(TTRPC_HEADER, 0, 100).feed(TTRPC_HEADER.pack(101, 1, 1, 0))


async def test_unknown_methods_and_bugs_are_answered_and_the_session_goes_on() -> None:
    async def handler(service: str, method: str, payload: bytes) -> bytes:
        if method == "Echo":
            return payload
        if method == "Bug":
            raise ValueError("a bug")
        raise TtrpcError(12, f"method {method}")

    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        path = str(Path(folder) / "s.sock")
        sessions: list[Session] = []

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sessions.append(Session(reader, writer, serve_conn=1, call_conn=2, handler=handler))
            await sessions[-1].run()

        server = await asyncio.start_unix_server(accept, path=path)
        reader, writer = await asyncio.open_unix_connection(path)

        async def never(*_args: object) -> bytes:
            raise AssertionError("the client serves nothing")

        client = Session(reader, writer, serve_conn=2, call_conn=1, handler=never)
        running = asyncio.create_task(client.run())
        with pytest.raises(TtrpcError) as unknown:
            await client.call("svc", "Nope", b"", 2.0)
        assert unknown.value.code == 12
        with pytest.raises(TtrpcError) as bug:
            await client.call("svc", "Bug", b"", 2.0)
        assert bug.value.code == 13
        big = b"y" * 20_000
        assert await client.call("svc", "Echo", big, 2.0) == big
        client.close()
        await running
        server.close()
        await server.wait_closed()


def test_generated_nri_modules_are_up_to_date() -> None:
    with tempfile.TemporaryDirectory() as out:
        generate(REPO, Path(out))
        fresh = Path(out) / "agent" / "legacy" / "deviceplugin" / "nri" / "proto"
        for name in MODULES:
            checked_in = (
                REPO / "agent" / "legacy" / "deviceplugin" / "nri" / "proto" / name
            ).read_text()
            assert (fresh / name).read_text() == checked_in, f"{name} is stale"
    assert ttrpc_pb2.Request(service="s").SerializeToString() == b"\n\x01s"
