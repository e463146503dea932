"""Every process of a claim's share held to its memory (issue 38): MPS limits each client
process, not their sum, so four processes of one share can hold four times it. The agent
adds up what NVML reports for the processes its cgroups attribute to the share and acts by
``dra.memory_policy`` (``report`` by default, ``enforce`` where the operator says).

A real simulated agent is the node's DRA driver; the claim is admitted at its binding
answer (``AnswerClaim`` over gRPC). Real processes carry the share's
``GPUSHARE_LEASE_ID``; their cgroups are given per PID (as in
tests/integration/control/test_identity_scenarios.py); the fake GPU reports their memory and
the fake MPS daemon lists them as clients. A claim shared by two pods binds its lease to no
one pod: its processes are known by the cgroups of the pods the claim is reserved for."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from agent.core.identity import CgroupFacts
from agent.core.types import GpuProcess
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import App
from tests.dra.fixtures import claim_user_pod, reserve
from tests.dra.test_answer_claim import ask, claim, leases, result
from tests.integration.control.test_identity_scenarios import cgroups, tenant
from tests.kubeworld.apiserver import FakeApiServer

CONTAINER = "d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98"
STRANGER = "a5c1f8d5-1919-434d-add7-4afaafdaef89"


@pytest.fixture
def extra_settings() -> dict[str, object]:
    """The janitor's passes are the test's; the operator's policy: enforce."""
    return {
        "janitor.interval_s": 3600,
        "readiness.interval_s": 3600,
        "dra.memory_policy": "enforce",
    }


def shared_claim(api: FakeApiServer, pods: int) -> tuple[dict[str, Any], list[str]]:
    """A claim of 4 GiB on gpu-0 (made by hand, not for one pod) reserved for ``pods``
    pods of one user; their UIDs."""
    asked = claim(result("gpu-0"))
    made = [claim_user_pod(api, asked, f"shared-{i}") for i in range(pods)]
    return reserve(asked, *made), [p["metadata"]["uid"] for p in made]


@contextlib.contextmanager
def processes(lease_id: str, count: int) -> Iterator[list[int]]:
    """``count`` real processes whose environment names ``lease_id``."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(tenant(lease_id)) for _ in range(count)]


def on_device(app: App, device_uuid: str, used: dict[int, int]) -> None:
    gpu, mps = app.ports.gpu, app.ports.mps
    assert isinstance(gpu, FakeGpuBackend) and isinstance(mps, FakeMpsManager)
    for pid in used:
        mps.connect(device_uuid, pid)
    gpu.process_table[device_uuid] = [GpuProcess(pid, b, mps=True) for pid, b in used.items()]


async def four_processes_over_the_share(
    agent: App, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, pod_of: list[int]
) -> tuple[list[str], list[int]]:
    """A shared claim's share with four processes of 1.5 GiB (6 GiB over its 4 GiB), the
    i-th in the pod ``pod_of[i]`` (-1: a pod the claim is not reserved for); the janitor's
    pass, and the PIDs."""
    asked, pod_uids = shared_claim(api, 2)
    assert [a[2:] for a in await ask(agent, asked)] == [(True, "Admitted")]
    [lease] = await leases(agent)
    assert lease.memory_bytes == 4 * GIB and lease.workload == ""  # no one pod's
    assert agent.control is not None
    with processes(lease.lease_id, 4) as pids:
        cgroups(
            monkeypatch,
            {
                pid: CgroupFacts(pod_uids[p] if p >= 0 else STRANGER, CONTAINER)
                for pid, p in zip(pids, pod_of, strict=True)
            },
        )
        on_device(agent, lease.device_uuid, dict.fromkeys(pids, 3 * GIB // 2))
        return await agent.control.janitor.pass_once(dry_run=False), pids


def terminated(agent: App) -> set[int]:
    mps = agent.ports.mps
    assert isinstance(mps, FakeMpsManager)
    return {pid for _, _, pid in mps.terminated}


async def test_four_processes_of_a_shared_claim_over_its_share_are_terminated(
    agent: App, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned, pids = await four_processes_over_the_share(agent, api, monkeypatch, [0, 0, 1, 1])
    (violation,) = [x for x in planned if "over its limit" in x]
    assert "uses 6.0 GiB" in violation and "terminate its 4 client(s)" in violation
    assert terminated(agent) == set(pids)


async def test_a_process_of_a_pod_the_claim_is_not_for_is_never_ended_for_it(
    agent: App, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process of a pod the claim is not reserved for (as last read: it may have joined
    since) that names the share's lease is the share's by that name only: its memory
    counts, but it is never ended for it; the three of the claim's pods are."""
    planned, pids = await four_processes_over_the_share(agent, api, monkeypatch, [0, 1, 1, -1])
    (violation,) = [x for x in planned if "over its limit" in x]
    assert "uses 6.0 GiB" in violation and "terminate its 3 client(s)" in violation
    assert "1 client(s) known by their GPUSHARE_LEASE_ID only" in violation
    assert terminated(agent) == set(pids[:3])
    assert await agent.events.flush()
    assert not [e for e in agent.events.since(0) if e.kind == "lease.identity_mismatch"]


@pytest.mark.parametrize("extra_settings", [{"janitor.interval_s": 3600}])  # the default
async def test_by_default_the_share_is_reported_and_nothing_is_ended(
    agent: App, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned, _ = await four_processes_over_the_share(agent, api, monkeypatch, [0, 0, 1, 1])
    (violation,) = [x for x in planned if "over its limit" in x]
    assert "terminate" not in violation
    assert terminated(agent) == set()
