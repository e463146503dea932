"""Bytes that are not a valid message answer INVALID_ARGUMENT on every RPC, never UNKNOWN
or INTERNAL, and the agent keeps serving."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.api.registration import SERVICE
from tests.helpers import running_app, short_dir, sim_settings

GARBAGE = (b"\xff\xff\xff", b"\x0a\xff\x01", b"\x08" + b"\xff" * 11, b"\x12\x05ab")


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


async def test_malformed_bytes_are_invalid_argument_on_every_rpc(root: Path) -> None:
    settings = sim_settings(root)
    async with (
        running_app(settings),
        grpc.aio.insecure_channel(f"unix:{settings.unix_socket_path}") as channel,
    ):
        for method in SERVICE.methods:
            path = f"/{SERVICE.full_name}/{method.name}"
            for payload in (*GARBAGE, random := os.urandom(64)):
                if method.server_streaming:
                    call = channel.unary_stream(path, lambda b: b, lambda b: b)(payload, timeout=5)
                    with pytest.raises(grpc.aio.AioRpcError) as error:
                        async for _ in call:
                            pass
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as error:
                        await channel.unary_unary(path, lambda b: b, lambda b: b)(
                            payload, timeout=5
                        )
                code = error.value.code()
                if code is grpc.StatusCode.INVALID_ARGUMENT and payload is not random:
                    assert f"not a valid {method.input_type.name}" in (error.value.details() or "")
                else:  # random bytes that happen to parse get a real answer or a refusal
                    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), path
        ping = channel.unary_unary(f"/{SERVICE.full_name}/Ping", lambda b: b, lambda b: b)
        assert await ping(b"", timeout=5) == b""
