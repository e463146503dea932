import pytest

from agent.admission.isolation import (
    ComputeIsolation,
    FaultIsolation,
    Isolation,
    MemoryIsolation,
    isolation_of,
    isolation_phrase,
)
from agent.core.types import Device, SharingMode
from agent.core.units import GIB

HARDWARE = Isolation(MemoryIsolation.HARDWARE, FaultIsolation.CONTAINED, ComputeIsolation.PARTITION)
MPS = Isolation(
    MemoryIsolation.LIMIT, FaultIsolation.SHARED_WITH_TRUST_DOMAIN, ComputeIsolation.SHARE
)


def gpu(mode: SharingMode) -> Device:
    return Device("GPU-0", 0, "H100", 80 * GIB, sharing_mode=mode)


def mig(mode: SharingMode) -> Device:
    return Device("MIG-0", 0, "H100", 40 * GIB, mode, parent_uuid="GPU-0", mig_profile="3g.40gb")


CASES = [
    ("exclusive whole GPU: one lease has all of it", gpu(SharingMode.EXCLUSIVE), HARDWARE),
    ("exclusive MIG instance: one lease, a hardware slice", mig(SharingMode.EXCLUSIVE), HARDWARE),
    ("MPS on a whole GPU: clients of one server", gpu(SharingMode.MPS), MPS),
    # the MIG wall is between instances; the leases inside one share its MPS server
    ("MPS inside a MIG instance", mig(SharingMode.MPS), MPS),
]


@pytest.mark.parametrize(("case", "device", "expected"), CASES)
def test_isolation_of(case: str, device: Device, expected: Isolation) -> None:
    assert isolation_of(device) == expected, case


def test_the_words_on_the_wire() -> None:
    assert [str(w) for w in (MPS.memory, MPS.faults, MPS.compute)] == [
        "limit",
        "shared-with-trust-domain",
        "share",
    ]
    assert [str(w) for w in (HARDWARE.memory, HARDWARE.faults, HARDWARE.compute)] == [
        "hardware",
        "contained",
        "partition",
    ]


def test_phrases_for_people_fit_a_status_line() -> None:
    assert HARDWARE.phrase == "memory: its own; faults: contained; compute: dedicated SMs"
    assert MPS.phrase == (
        "memory: a per-client limit; faults: shared by its leases; compute: an SM share"
    )
    assert max(len(HARDWARE.phrase), len(MPS.phrase)) <= 80


def test_a_word_from_a_newer_agent_is_shown_as_it_came() -> None:
    assert isolation_phrase("hardware", "rebooted", "") == (
        "memory: its own; faults: rebooted; compute: ?"
    )
