"""What the device plugin's containers get at /dev/shm and for the pipe directory: the
device's MPS servers' own shared memory, made ready for the lease's trust domain before
Allocate (or NRI's CreateContainer) is answered, else kubelet.shm_dir; the pipe directory
read-only; nothing handed out (and nothing recorded) when the memory cannot be made
ready. On the real store, with a stand-in for the MPS manager."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.config.kubelet import KubeletSettings
from agent.core.errors import MpsError
from agent.core.types import AdmissionRequest, PriorityClass
from agent.core.units import GIB
from agent.legacy.deviceplugin.kubelet.port import AllocationRefused
from agent.legacy.deviceplugin.nri.port import InjectionRefused, PodRef
from agent.legacy.deviceplugin.podalloc import NRI_MARKER, PodAllocator
from agent.legacy.podleases import LEASE_ANNOTATION
from tests.integration.state.races import Setup, clocked_node

LEGACY = "/run/gpushare-shm"


@dataclass
class Memory:
    """The MPS manager's claim_shm, recorded; ``own`` "" as for a legacy daemon."""

    own: str = "/run/gpushare/shm/GPU-x"
    error: str = ""
    claims: list[tuple[str, str, bool]] = field(default_factory=list)

    async def claim_shm(self, device_uuid: str, trust_domain: str, *, sole: bool = False) -> str:
        self.claims.append((device_uuid, trust_domain, sole))
        if self.error:
            raise MpsError(self.error)
        return self.own


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    async with clocked_node(tmp_path) as found:
        yield found


async def no_pod(_units: Sequence[str]) -> str | None:
    raise AssertionError("not asked here")


def allocator(setup: Setup, memory: Memory | None, shm_dir: str = LEGACY) -> PodAllocator:
    node, store, events, clock = setup
    settings = KubeletSettings(enabled=True, slots=4, hold_s=30.0, shm_dir=shm_dir)
    return PodAllocator(
        node, events, settings, store=store, pod_of_units=no_pod, clock=clock, shm=memory
    )


async def admit(setup: Setup, pod: str, domain: str = "team-a") -> str:
    node, _store, _events, clock = setup
    request = AdmissionRequest(
        f"uid-{pod}/0", "t", domain, PriorityClass.BURSTABLE, 2 * GIB, 10, pod=f"ns/{pod}"
    )
    result = await node.admit(request)
    assert result.lease is not None, result.decision
    clock.advance(1.0)
    return result.lease.lease_id


def mounts_of(answer: object) -> dict[str, tuple[str, bool]]:
    return {m.container_path: (m.host_path, m.read_only) for m in answer.mounts}  # type: ignore[attr-defined]


async def test_a_container_gets_its_servers_own_memory_ready_for_its_trust_domain(
    setup: Setup,
) -> None:
    memory = Memory()
    plugin = allocator(setup, memory)
    await admit(setup, "a")
    await admit(setup, "b")
    first = await plugin.allocate(["share-0"])
    second = await plugin.allocate(["share-1"])
    device = setup[0].leases[first.envs["GPUSHARE_LEASE_ID"]].device_uuid
    for answer in (first, second):
        mounts = mounts_of(answer)
        assert mounts["/dev/shm"] == (memory.own, False)
        pipe = answer.envs["CUDA_MPS_PIPE_DIRECTORY"]
        assert mounts[pipe] == (pipe, True), "the pipe directory is read-only"
    # another live lease on the device: a legacy daemon is not started again under it
    assert memory.claims == [(device, "team-a", False), (device, "team-a", False)]


async def test_the_only_lease_of_a_device_says_so(setup: Setup) -> None:
    memory = Memory()
    plugin = allocator(setup, memory)
    await admit(setup, "a")
    await plugin.allocate(["share-0"])
    assert memory.claims[0][1:] == ("team-a", True)


async def test_servers_without_memory_of_their_own_mean_the_shared_directory(
    setup: Setup,
) -> None:
    await admit(setup, "a")
    await admit(setup, "b")
    legacy = await allocator(setup, Memory(own="")).allocate(["share-0"])
    assert mounts_of(legacy)["/dev/shm"] == (LEGACY, False)
    none = await allocator(setup, Memory(own=""), shm_dir="").allocate(["share-1"])
    assert "/dev/shm" not in mounts_of(none)


async def test_no_mps_manager_means_the_shared_directory_as_before(setup: Setup) -> None:
    await admit(setup, "a")
    answer = await allocator(setup, None).allocate(["share-0"])
    assert mounts_of(answer)["/dev/shm"] == (LEGACY, False)


async def test_memory_that_cannot_be_made_ready_refuses_and_records_nothing(
    setup: Setup,
) -> None:
    _node, _store, events, _clock = setup
    plugin = allocator(setup, Memory(error="no running MPS daemon for device GPU-x"))
    lease = await admit(setup, "a")
    with pytest.raises(AllocationRefused, match="no running MPS daemon"):
        await plugin.allocate(["share-0"])
    assert not [e for e in events.since(0) if e.kind == "lease.allocated"]
    plugin._shm = Memory()  # the daemon is back: the lease is still there to allocate
    answer = await plugin.allocate(["share-0"])
    assert answer.envs["GPUSHARE_LEASE_ID"] == lease


async def test_nri_containers_get_the_same_and_are_refused_the_same(setup: Setup) -> None:
    node = setup[0]
    memory = Memory()
    plugin = allocator(setup, memory)
    lease_id = await admit(setup, "a", domain="team-b")
    lease = node.leases[lease_id]
    pod = PodRef("ns", "a", "uid-a", {LEASE_ANNOTATION: lease_id})
    made = await plugin.inject(pod, "main", [f"{NRI_MARKER}=1"])
    assert made is not None
    mounts = {m.container_path: (m.host_path, m.read_only) for m in made.mounts}
    assert mounts["/dev/shm"] == (memory.own, False)
    assert mounts[made.env["CUDA_MPS_PIPE_DIRECTORY"]][1] is True
    assert memory.claims == [(lease.device_uuid, "team-b", True)]
    memory.error = "servers still run after shutdown_server -f"
    with pytest.raises(InjectionRefused, match="still run"):
        await plugin.inject(pod, "second", [f"{NRI_MARKER}=1"])
