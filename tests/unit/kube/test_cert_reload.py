"""The webhook's certificate is loaded again when its files change (a rotated Secret), and
a pair caught half written keeps the previous one serving."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.legacy.cluster.service import ReloadingTls, reload_certificate
from tests.certs import make_pki

pytestmark = pytest.mark.timeout(30)


async def served_certificate(port: int) -> bytes:
    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    peer = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return bytes(peer)


async def until_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()
    writer.close()


def der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


@pytest.fixture
async def pki_pair(tmp_path: Path) -> AsyncIterator[tuple[Path, Path]]:
    yield make_pki(tmp_path / "a").root, make_pki(tmp_path / "b").root


async def test_a_rotated_certificate_is_served_and_a_half_written_one_is_not(
    tmp_path: Path, pki_pair: tuple[Path, Path]
) -> None:
    old, new = pki_pair
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(old / "server.crt", cert)
    shutil.copy(old / "server.key", key)
    tls = ReloadingTls(str(cert), str(key))
    server = await asyncio.start_server(until_closed, "127.0.0.1", 0, ssl=tls.context)
    port = server.sockets[0].getsockname()[1]
    watching = asyncio.create_task(reload_certificate(tls, 0.02))
    try:
        assert await served_certificate(port) == der(old / "server.crt")
        shutil.copy(new / "server.crt", cert)  # the certificate first, its key not yet
        await asyncio.sleep(0.2)
        assert await served_certificate(port) == der(old / "server.crt")
        shutil.copy(new / "server.key", key)
        for _ in range(100):
            if await served_certificate(port) == der(new / "server.crt"):
                break
            await asyncio.sleep(0.02)
        assert await served_certificate(port) == der(new / "server.crt")
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        server.close()
        await server.wait_closed()
