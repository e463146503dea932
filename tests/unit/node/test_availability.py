"""Whether a device takes new leases, and the reason given when it does not."""

from __future__ import annotations

from typing import Any

import pytest

from agent.core.mpsstate import MpsDaemonState
from agent.core.types import Device, ReasonCode, SharingMode
from agent.core.units import GIB
from agent.node.availability import Availability
from agent.node.events import EventLog

MPS = Device("GPU-a", 0, "H100", 80 * GIB)
EXCLUSIVE = Device("GPU-b", 1, "H100", 80 * GIB, sharing_mode=SharingMode.EXCLUSIVE)


class Store:
    def __init__(self, writable: bool) -> None:
        self._writable = writable

    def writable(self) -> bool:
        return self._writable


def daemon(**fields: Any) -> MpsDaemonState:
    return MpsDaemonState(**{"device_uuid": "GPU-a", "up": True, "backend": "b", **fields})


@pytest.mark.parametrize(
    ("device", "state", "writable", "reason", "detail"),
    [
        (MPS, daemon(), True, None, ""),
        (MPS, None, True, ReasonCode.DEVICE_UNAVAILABLE, "MPS control daemon is down (no daemon)"),
        (MPS, daemon(up=False, detail="restart failed: x"), True, ReasonCode.DEVICE_UNAVAILABLE,
         "MPS control daemon is down (restart failed: x)"),
        (MPS, daemon(answering=False, detail="timed out after 1 s"), True,
         ReasonCode.DEVICE_UNAVAILABLE, "MPS control daemon does not answer (timed out after 1 s)"),
        (MPS, daemon(answering=False), True, ReasonCode.DEVICE_UNAVAILABLE,
         "MPS control daemon does not answer (a probe went unanswered)"),
        (EXCLUSIVE, None, True, None, ""),
        (MPS, daemon(), False, ReasonCode.STORE_UNAVAILABLE,
         "the state store cannot write: failing closed"),
    ],
)  # fmt: skip
def test_closed_and_why(
    device: Device,
    state: MpsDaemonState | None,
    writable: bool,
    reason: ReasonCode | None,
    detail: str,
) -> None:
    availability = Availability(
        {device.uuid: device},
        store=Store(writable),  # type: ignore[arg-type]
        events=EventLog(),
        clock=lambda: 0.0,
    )
    assert availability.closed(device, state) == (reason, detail)
