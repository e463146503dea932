"""Admission over the real gRPC listeners (Unix socket, and TCP with a token on loopback
behind api.insecure_loopback), real SQLite."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from agent.api.proto import agent_pb2 as pb
from agent.api.proto import agent_pb2_grpc as pb_grpc
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import App, Ports
from tests.certs import make_token
from tests.helpers import fake_ports, running_app, short_dir, sim_settings

TOKEN = "5f0c1e9a7b3d4c2e8f6a1b0c9d8e7f6a5b4c3d2e1f0a9b8c"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def ports() -> Ports:
    return fake_ports(2)


@pytest.fixture
async def agent(root: Path) -> AsyncIterator[App]:
    make_token(root / "token", TOKEN)
    settings = sim_settings(
        root,
        **{
            "api.tcp_listen": "127.0.0.1:0",
            "api.token_file": str(root / "token"),
            "api.insecure_loopback": True,
            "admission.reservation_ttl_s": 0.5,
        },
    )
    async with running_app(settings, ports()) as app:
        yield app


def unix(app: App) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"unix:{app.settings.unix_socket_path}")


def tcp(app: App) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{app.tcp_port}")


AUTH = (("authorization", f"Bearer {TOKEN}"),)


def req(
    request_id: str,
    memory_gib: float = 10,
    pct: float = 25,
    domain: str = "a",
    priority: int = pb.BURSTABLE,
) -> pb.Request:
    return pb.Request(
        request_id=request_id,
        tenant="t",
        trust_domain=domain,
        priority=priority,
        memory_bytes=int(memory_gib * GIB),
        thread_pct=pct,
    )


async def test_admit_returns_the_lease_and_its_environment_idempotently(agent: App) -> None:
    async with tcp(agent) as channel:
        stub = pb_grpc.AgentStub(channel)
        first = await stub.Admit(pb.AdmitRequest(request=req("job-1")), metadata=AUTH)
        again = await stub.Admit(pb.AdmitRequest(request=req("job-1")), metadata=AUTH)
    assert first.decision.admitted and first.lease.state == "admitted"
    assert again.lease.lease_id == first.lease.lease_id
    env = dict(first.env)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["GPUSHARE_LEASE_ID"] == first.lease.lease_id
    assert first.mounts[0].host_path == env["CUDA_MPS_PIPE_DIRECTORY"]
    assert len(agent.node.leases) == 1  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "metadata", [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)]
)
async def test_tcp_without_the_right_token_is_unauthenticated(
    agent: App, metadata: tuple[tuple[str, str], ...]
) -> None:
    async with tcp(agent) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await pb_grpc.AgentStub(channel).GetNode(pb.GetNodeRequest(), metadata=metadata)
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_admin_rpcs_only_on_the_unix_socket(agent: App) -> None:
    async with tcp(agent) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await pb_grpc.AgentStub(channel).Drain(pb.DrainRequest(), metadata=AUTH)
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
    async with unix(agent) as channel:
        stub = pb_grpc.AgentStub(channel)
        drained = await stub.Drain(pb.DrainRequest(reason="test"))
        assert len(drained.devices) == 2
        refused = await stub.Admit(pb.AdmitRequest(request=req("x")))
        assert refused.decision.reason == "DRAINING"
        await stub.Undrain(pb.DrainRequest())
        assert (await stub.Admit(pb.AdmitRequest(request=req("x")))).decision.admitted


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (
            pb.Request(
                tenant="t", trust_domain="a", priority=pb.BURSTABLE, memory_bytes=1, thread_pct=5
            ),
            "request.request_id",
        ),
        (req("ok", pct=0), "request.thread_pct"),
        (req("ok", pct=100.5), "request.thread_pct"),
        (
            pb.Request(request_id="r", tenant="t", trust_domain="a", memory_bytes=1, thread_pct=5),
            "request.priority",
        ),
        (
            pb.Request(
                request_id="r", tenant="t", trust_domain="a", priority=pb.BURSTABLE, thread_pct=5
            ),
            "request.memory_bytes",
        ),
        (req("x" * 200), "request.request_id"),
        (req("bad id with spaces"), "request.request_id"),
        (
            pb.Request(
                request_id="r",
                tenant="t",
                trust_domain="a",
                priority=pb.BURSTABLE,
                thread_pct=5,
                sizing=pb.Sizing(parameters=10, mode="inference"),
            ),
            "request.sizing.layers",
        ),
    ],
)
async def test_bad_requests_are_invalid_argument_naming_the_field(
    agent: App, request_: pb.Request, field: str
) -> None:
    async with unix(agent) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await pb_grpc.AgentStub(channel).Admit(pb.AdmitRequest(request=request_))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert field in (info.value.details() or "")


async def test_sizing_spec_turns_into_memory(agent: App) -> None:
    sizing = pb.Sizing(parameters=2_000_000_000, mode="training")
    request = pb.Request(
        request_id="train",
        tenant="t",
        trust_domain="a",
        priority=pb.BURSTABLE,
        thread_pct=50,
        sizing=sizing,
    )
    async with unix(agent) as channel:
        answer = await pb_grpc.AgentStub(channel).Admit(pb.AdmitRequest(request=request))
    assert answer.lease.memory_bytes == 32_000_000_000


async def test_gang_reserve_commit_abort_and_expiry(agent: App) -> None:
    async with unix(agent) as channel:
        stub = pb_grpc.AgentStub(channel)
        for i in range(2):
            held = await stub.Reserve(
                pb.ReserveRequest(request=req(f"g1-{i}"), gang_id="g1", ttl_s=30)
            )
            assert held.lease.state == "reserved"
        committed = await stub.Commit(pb.GangRequest(gang_id="g1"))
        assert [x.state for x in committed.leases] == ["admitted", "admitted"]

        await stub.Reserve(pb.ReserveRequest(request=req("g2-0"), gang_id="g2", ttl_s=30))
        aborted = await stub.Abort(pb.GangRequest(gang_id="g2"))
        assert [x.state for x in aborted.leases] == ["released"]

        await stub.Reserve(pb.ReserveRequest(request=req("g3-0", 60), gang_id="g3", ttl_s=0.2))
        await asyncio.sleep(1.5)  # the reaper expires it and frees its capacity
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Commit(pb.GangRequest(gang_id="g3"))
        assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "expired" in (info.value.details() or "")
        kinds = [e.kind for e in agent.events.since(0)]
        assert "lease.expired" in kinds
        assert (await stub.Admit(pb.AdmitRequest(request=req("after", 60)))).decision.admitted

        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Release(pb.ReleaseRequest(lease_id="l-nope"))
        assert info.value.code() is grpc.StatusCode.NOT_FOUND


async def test_batch_keeps_its_order_and_fills_devices(agent: App) -> None:
    batch = [req(f"b{i}", memory_gib=30, domain="a") for i in range(6)]
    async with unix(agent) as channel:
        answer = await pb_grpc.AgentStub(channel).AdmitBatch(pb.AdmitBatchRequest(requests=batch))
    assert list(answer.order) == [f"b{i}" for i in range(6)]
    admitted = [r.decision.admitted for r in answer.results]
    assert admitted == [True, True, True, True, False, False]  # 2 per 80 GiB device
    assert answer.results[4].decision.reason == "NO_MEMORY"


async def test_watch_events_resumes_from_a_sequence(agent: App) -> None:
    async with unix(agent) as channel:
        stub = pb_grpc.AgentStub(channel)
        await stub.Admit(pb.AdmitRequest(request=req("w1")))
        await stub.Admit(pb.AdmitRequest(request=req("w2")))
        seen = []
        async for event in stub.WatchEvents(pb.WatchEventsRequest(since_seq=0)):
            seen.append(event)
            if event.kind == "lease.admitted" and event.attrs["request_id"] == "w2":
                break
        resume_after = seen[-2].seq
        resumed = stub.WatchEvents(pb.WatchEventsRequest(since_seq=resume_after))
        first = await resumed.read()
        resumed.cancel()
    assert [e.seq for e in seen] == sorted(e.seq for e in seen)
    assert first.seq == seen[-1].seq and first.attrs["request_id"] == "w2"


async def test_a_store_that_cannot_write_fails_closed(root: Path) -> None:
    from agent.core.errors import StateError
    from agent.state.sqlite import SqliteStateStore

    class BrokenDisk(SqliteStateStore):
        broken = False

        def _write(self, batches):  # type: ignore[no-untyped-def]
            if self.broken:
                raise StateError("disk full")
            super()._write(batches)

        async def heartbeat(self, *, at: float) -> None:
            if self.broken:
                self._writable = False
                raise StateError("disk full")
            await super().heartbeat(at=at)

    settings = sim_settings(root)
    store = BrokenDisk(settings.state_db_path)
    p = ports()
    p.store = store
    async with running_app(settings, p) as app, unix(app) as channel:
        stub = pb_grpc.AgentStub(channel)
        store.broken = True
        refused = await stub.Admit(pb.AdmitRequest(request=req("lost")))
        assert refused.decision.reason == "STORE_UNAVAILABLE"
        assert not app.node.leases  # type: ignore[union-attr]
        after = await stub.Admit(pb.AdmitRequest(request=req("lost")))
        assert after.decision.reason == "STORE_UNAVAILABLE", "closed until a write works"
        assert "state store" in " ".join(app.readiness_problems())
        store.broken = False  # the disk has room again: the heartbeat notices
        for _ in range(40):
            if store.writable():
                break
            await asyncio.sleep(0.1)
        assert (await stub.Admit(pb.AdmitRequest(request=req("lost")))).decision.admitted


async def test_admission_metrics(agent: App) -> None:
    import aiohttp

    async with unix(agent) as channel:
        stub = pb_grpc.AgentStub(channel)
        await stub.Admit(pb.AdmitRequest(request=req("m1", 10)))
        await stub.Admit(pb.AdmitRequest(request=req("m2", 500)))
    assert agent.http is not None
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{agent.http.port}/metrics") as response,
    ):
        text = await response.text()
    assert 'gpushare_admissions_total{reason="",result="admitted"} 1.0' in text
    assert 'gpushare_admissions_total{reason="NO_MEMORY",result="refused"} 1.0' in text
    assert "gpushare_admission_decision_seconds_count 2.0" in text
    assert 'gpushare_leases{state="admitted"} 1.0' in text
    assert text.count("gpushare_device_memory_committed_bytes{") == 2
    assert "gpushare_stranded_memory_bytes" in text


async def test_memory_below_what_mps_can_express_is_invalid(agent: App) -> None:
    tiny = pb.Request(
        request_id="tiny",
        tenant="t",
        trust_domain="a",
        priority=pb.GUARANTEED,
        thread_pct=1,
        sizing=pb.Sizing(parameters=1, mode="training"),
    )
    async with unix(agent) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await pb_grpc.AgentStub(channel).AdmitBatch(pb.AdmitBatchRequest(requests=[tiny]))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "at least 1 MiB" in (info.value.details() or "")
    assert not agent.node.leases  # type: ignore[union-attr]


async def test_retention_gate_over_grpc_names_the_protected_lease(root: Path) -> None:
    profiles = Path(__file__).parents[3] / "profiles"
    settings = sim_settings(root, **{"estimator.profiles_dir": str(profiles)})
    single = Ports(
        gpu=FakeGpuBackend.with_gpus(1),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )

    def make(
        request_id: str, priority: int, gib: int, pct: float, profile: str = ""
    ) -> pb.AdmitRequest:
        return pb.AdmitRequest(
            request=pb.Request(
                request_id=request_id,
                tenant="t",
                trust_domain="a",
                priority=priority,
                memory_bytes=gib * GIB,
                thread_pct=pct,
                profile=profile,
            )
        )

    async with running_app(settings, single) as app, unix(app) as channel:
        stub = pb_grpc.AgentStub(channel)
        first = await stub.Admit(make("serve", pb.GUARANTEED, 20, 50, "llm-7b-serve"))
        assert first.decision.admitted  # its profile's floor (0.85) protects it
        heavy = make("heavy", pb.BURSTABLE, 10, 100)
        answer = await stub.Explain(heavy)
        assert answer.decision.reason == "RETENTION_BELOW_FLOOR"
        detail = answer.decision.attempts[0].detail
        assert f"lease {first.lease.lease_id}" in detail and "synthetic" in detail
        predictions = dict(answer.decision.attempts[0].predictions)
        assert set(predictions) == {"candidate", first.lease.lease_id}

        await stub.Release(pb.ReleaseRequest(lease_id=first.lease.lease_id))
        second = await stub.Admit(make("etl", pb.BEST_EFFORT, 8, 25, "etl-batch"))  # no floor
        ok = await stub.Explain(heavy)
        assert ok.decision.admitted and ok.decision.estimator.startswith("model")
        assert set(ok.decision.predictions) == {"candidate", second.lease.lease_id}


async def test_inline_counters_drive_the_gate_and_estimates_show_in_get_node(root: Path) -> None:
    settings = sim_settings(root, **{"estimator.model_dir": "none"})  # the stated fallback
    single = Ports(
        gpu=FakeGpuBackend.with_gpus(1),
        mps=FakeMpsManager(),
        telemetry=[FakeTelemetrySource()],
        simulated=True,
    )

    def make(request_id: str, util: float, floor: float = 0.0) -> pb.AdmitRequest:
        return pb.AdmitRequest(
            request=pb.Request(
                request_id=request_id,
                tenant="t",
                trust_domain="a",
                priority=pb.BURSTABLE,
                memory_bytes=4 * GIB,
                thread_pct=50,
                retention_floor=floor,
                counters={"gpu_util": util, "sm_active": util / 100},
            )
        )

    async with running_app(settings, single) as app, unix(app) as channel:
        stub = pb_grpc.AgentStub(channel)
        first = await stub.Admit(make("a", 60, floor=0.7))
        second = await stub.Admit(make("b", 20))  # 60 + 20 <= 100: both keep everything
        assert second.decision.admitted
        assert dict(second.decision.predictions) == {"candidate": 1.0, first.lease.lease_id: 1.0}
        third = await stub.Admit(make("c", 50))  # 130% in all: 0.77, still above 0.7
        assert third.decision.admitted
        refused = await stub.Admit(make("d", 40))  # 170%: 0.59 < 0.7 for lease a
        assert refused.decision.reason == "RETENTION_BELOW_FLOOR"
        assert first.lease.lease_id in refused.decision.attempts[0].detail
        node = await stub.GetNode(pb.GetNodeRequest())
        estimates = dict(node.retention_estimates)
        assert estimates[first.lease.lease_id] == pytest.approx(100 / 130, abs=1e-3)
        assert len(estimates) == 3
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with running_app(settings, single) as app, unix(app) as channel:
            bad = make("e", 10)
            bad.request.counters["bad name"] = 1.0
            await pb_grpc.AgentStub(channel).Admit(bad)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_a_ledger_only_get_node_has_the_leases_and_ledger_and_nothing_else(
    agent: App,
) -> None:
    async with tcp(agent) as channel:
        stub = pb_grpc.AgentStub(channel)
        for name in ("job-1", "job-2", "job-3"):
            await stub.Admit(pb.AdmitRequest(request=req(name)), metadata=AUTH)
        await asyncio.sleep(0.3)  # a telemetry sample or two
        full = await stub.GetNode(pb.GetNodeRequest(), metadata=AUTH)
        light = await stub.GetNode(pb.GetNodeRequest(ledger_only=True), metadata=AUTH)
    assert full.latest_samples and full.mps and full.retention_estimates  # what it leaves out
    assert list(light.devices) == list(full.devices)
    assert list(light.leases) == list(full.leases) and len(light.leases) == 3
    assert list(light.ledger) == list(full.ledger)
    assert (light.node_name, light.injector, light.last_event_seq) == (
        full.node_name,
        full.injector,
        full.last_event_seq,
    )
    assert not (light.latest_samples or light.latest_windows or light.mps)
    assert not (light.retention_estimates or light.stale_devices)
