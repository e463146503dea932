"""A GPU that NVML reports lost (its GPU-lost event, XID 79) is closed as gone, which the
DRA driver publishes as a NoExecute taint; any other fault is not."""

from __future__ import annotations

import pytest

from agent.admission.policy import DeviceView
from agent.claims.inventory import gone_why
from agent.control.janitor import lost
from agent.core.types import Device, Event, ReasonCode
from agent.node.availability import GONE_DETAIL, LOST_DETAIL

H100 = Device("GPU-1", 0, "H100", 80 * 2**30)


def event(kind: str, **attrs: str) -> Event:
    return Event(0, 0.0, kind, "from NVML", device_uuid="GPU-1", attrs=attrs)


@pytest.mark.parametrize(
    ("seen", "is_lost"),
    [
        (event("gpu.unavailable"), True),
        (event("gpu.xid", data="79"), True),
        (event("gpu.xid", data="13"), False),
        (event("gpu.ecc_double_bit"), False),
        (event("mps.server_fatal"), False),
    ],
)
def test_which_events_say_the_gpu_is_lost(seen: Event, is_lost: bool) -> None:
    assert lost(seen) is is_lost


@pytest.mark.parametrize(
    ("detail", "why"),
    [(LOST_DETAIL, "lost"), (GONE_DETAIL, "not-listed"), ("gpu.xid: Xid 13 data 13", "")],
)
def test_the_gone_taints_value_says_how_the_gpu_went(detail: str, why: str) -> None:
    view = DeviceView(H100, closed=ReasonCode.DEVICE_UNAVAILABLE, closed_detail=detail)
    assert gone_why(view) == why
