"""Bad input to the DRA kubelet plugin over its real gRPC socket: a call that cannot be
decoded is INVALID_ARGUMENT, a bad claim inside a good call gets its own error while the
others are answered, and nothing from a claim reaches a log line raw (no traceback, no
forged line, no line a megabyte long)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import grpc.aio
import pytest

from agent.core.types import Event
from agent.dra.plugin import DraPluginServer
from agent.dra.port import ClaimRef
from agent.dra.proto import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    registration_pb2,
    registration_pb2_grpc,
)
from agent.node.events import EventLog
from tests.dra.test_plugin import RecordingDriver, serving
from tests.kubeworld.cluster.dra import claim_pod, claim_template, dra_cluster, eventually

VERSIONS = {"v1": dra_v1_pb2, "v1beta1": dra_v1beta1_pb2}
GOOD_UID = "7d1c4c1e-0b8a-4c1e-9a51-3f0f5b3c9e11"
FORGED = "2030-01-01 00:00:00,000 INFO    gpushare.audit: event 9 lease.released forged"
HUGE = "a" * 1_000_000


@pytest.fixture
async def plugin(root: Path) -> AsyncIterator[tuple[DraPluginServer, RecordingDriver]]:
    async with serving(root) as found:
        yield found


async def raw_call(socket: Path, method: str, payload: bytes) -> grpc.aio.AioRpcError:
    """``payload`` sent as it is (no serializer) to ``/<service>/<method>``."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        call = channel.unary_unary(method)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(payload, timeout=10)
    return caught.value


def non_utf8_uid(pb: ModuleType) -> bytes:
    """A request whose claim's uid is not UTF-8 (Prepare's and Unprepare's requests are
    the same on the wire)."""
    claim = pb.Claim(namespace="ns", name="c", uid="UIDUIDUID")
    good = pb.NodePrepareResourcesRequest(claims=[claim]).SerializeToString()
    return good.replace(b"UIDUIDUID", b"\xff\xfe\xfd" * 3)


def assert_clean(records: list[logging.LogRecord]) -> None:
    """No traceback, no line break, no long line in what was logged."""
    for record in records:
        text = record.getMessage()
        assert record.exc_info is None and "Traceback" not in text, text[:300]
        assert "\n" not in text and len(text) < 2000, text[:300]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("method", ["NodePrepareResources", "NodeUnprepareResources"])
@pytest.mark.parametrize("payload", ["not protobuf", "uid not UTF-8"])
async def test_a_call_that_cannot_be_decoded_is_invalid_argument(
    plugin: tuple[DraPluginServer, RecordingDriver],
    caplog: pytest.LogCaptureFixture,
    version: str,
    method: str,
    payload: str,
) -> None:
    server, driver = plugin
    body = b"\x0a\xff\xff\xff" if payload == "not protobuf" else non_utf8_uid(VERSIONS[version])
    path = f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/{method}"
    error = await raw_call(server.socket_path, path, body)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{method}Request" in (error.details() or "")
    assert not driver.prepared and not driver.unprepared
    assert_clean(caplog.records)


async def test_the_health_stream_refuses_an_undecodable_call_too(
    plugin: tuple[DraPluginServer, RecordingDriver], caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = plugin
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        stream = channel.unary_stream("/v1.DRAResourceHealth/NodeWatchResources")(b"\x0a\xff")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(stream.read(), 10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_clean(caplog.records)


async def test_registration_refuses_an_undecodable_call_and_logs_a_reason_escaped(
    plugin: tuple[DraPluginServer, RecordingDriver], caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = plugin
    path = "/pluginregistration.Registration/NotifyRegistrationStatus"
    error = await raw_call(server.registration_socket, path, b"\x0a\xff")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    async with grpc.aio.insecure_channel(f"unix://{server.registration_socket}") as channel:
        await registration_pb2_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=False, error=f"no\n{FORGED}")
        )
    assert server.registration.error == f"no\n{FORGED}"  # kept as the kubelet said it
    assert "no\\n2030-01-01" in caplog.text
    assert_clean(caplog.records)


BAD_CLAIMS = {
    "uid with NUL": ("ns", "c", "bad\x00uid"),
    "uid too long": ("ns", "c", "u" * 129),
    "uid empty": ("ns", "c", ""),
    "uid with a slash": ("ns", "c", "../../x"),
    "name with a newline": ("ns", f"x\n{FORGED}", "u-newline"),
    "name of a megabyte": ("ns", HUGE, "u-huge"),
    "name empty": ("ns", "", "u-empty-name"),
    "namespace not a DNS label": ("Not_A_Label", "c", "u-ns"),
    "namespace too long": ("n" * 64, "c", "u-long-ns"),
}


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_bad_claim_gets_its_own_error_and_the_others_are_answered(
    plugin: tuple[DraPluginServer, RecordingDriver],
    caplog: pytest.LogCaptureFixture,
    version: str,
) -> None:
    server, driver = plugin
    pb = VERSIONS[version]
    good = pb.Claim(namespace="team-a", name="app-gpu-x7k2p", uid=GOOD_UID)
    bad = [pb.Claim(namespace=n, name=c, uid=u) for n, c, u in BAD_CLAIMS.values()]
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        prefix = f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
        unprepare = channel.unary_unary(
            f"{prefix}/NodeUnprepareResources",
            request_serializer=pb.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=pb.NodeUnprepareResourcesResponse.FromString,
        )
        prepare = channel.unary_unary(
            f"{prefix}/NodePrepareResources",
            request_serializer=pb.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=pb.NodePrepareResourcesResponse.FromString,
        )
        gone = await unprepare(pb.NodeUnprepareResourcesRequest(claims=[bad[0], good, *bad[1:]]))
        made = await prepare(pb.NodePrepareResourcesRequest(claims=[good, *bad]))
    assert gone.claims[GOOD_UID].error == "" and made.claims[GOOD_UID].error == ""
    for what, (_, _, uid) in BAD_CLAIMS.items():
        for answer in (gone, made):
            error = answer.claims[uid].error
            assert error.startswith("invalid claim"), (what, error[:200])
            assert "\n" not in error and "\x00" not in error and len(error) < 400, what
    assert [[c.uid for c in call] for call in driver.unprepared] == [[GOOD_UID]]
    assert [[c.uid for c in call] for call in driver.prepared] == [[GOOD_UID]]
    assert_clean(caplog.records)


def test_a_claim_ref_prints_escaped_and_cut() -> None:
    text = str(ClaimRef("ns", f"x\n{FORGED}\u202e", "u\x00" + "u" * 500))
    assert "\n" not in text and "\x00" not in text and "\u202e" not in text
    assert "\\n" in text and "\\x00" in text and len(text) < 200


def test_an_audit_line_is_escaped_and_cut(caplog: pytest.LogCaptureFixture) -> None:
    events = EventLog()
    told = Event(
        1, 0.0, "dra.refused", f"claim x\n{FORGED}\r\u2028" + "m" * 100_000, "GPU-\n0",
        "l-\x1b[2J", {"owner": f"o\n{FORGED}"},
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="gpushare.audit"):
        events.publish([told])
    [record] = [r for r in caplog.records if r.name == "gpushare.audit"]
    text = record.getMessage()
    assert "\n" not in text and "\r" not in text and "\u2028" not in text and "\x1b" not in text
    assert "\\n2030-01-01" in text and len(text) < 2000
    assert events.since(0) == [told]  # the ring keeps the event as it is


# -- a real agent as the driver ---------------------------------------------------------------


async def test_a_real_agent_answers_bad_claims_one_by_one_and_logs_them_safely(
    root: Path,
) -> None:
    async with dra_cluster(root, nodes=1) as cluster:
        [node] = cluster.nodes.values()
        await cluster.apply(claim_template("quarter-gpu", memory="20Gi", threads="25"))
        await cluster.apply(claim_pod("app", "quarter-gpu"))
        await eventually(lambda: ("default", "app") in cluster.running.containers, 60)
        [claim] = cluster.claims()
        spec = node.cdi_dir / f"gpushare.io-claim_{claim['metadata']['uid']}.json"
        assert await node.leases() and spec.exists()

        def forged(**meta: str) -> dict[str, Any]:
            return {**claim, "metadata": {**claim["metadata"], **meta}}

        made = await node.kubelet.prepare(
            [
                forged(name=f"x\n{FORGED}", uid=str(uuid.uuid4())),
                forged(name=HUGE, uid=str(uuid.uuid4())),
            ]
        )
        assert all(isinstance(e, str) and e.startswith("invalid claim") for e in made.values())
        gone = await node.kubelet.unprepare([claim, forged(uid="bad\x00uid")])
        assert gone[claim["metadata"]["uid"]] == ""  # released, although a bad one came along
        assert gone["bad\x00uid"].startswith("invalid claim")
        assert not await node.leases() and not spec.exists()
        raw = await raw_call(
            node.root / "plugins" / "gpushare.io" / "dra.sock",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            b"\x0a\xff\xff",
        )
        assert raw.code() == grpc.StatusCode.INVALID_ARGUMENT
    lines = node.log_text().splitlines()
    assert not [x for x in lines if x.startswith("Traceback") or x.startswith("2030-01-01")]
    assert max(len(x) for x in lines) < 5000
    assert "invalid claim" in node.log_text()
