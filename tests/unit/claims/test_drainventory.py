"""What the node publishes as a DRA driver, from its ledger's views: names, capacities that
agree with the ledger, attributes, taints and health."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.admission.policy import DeviceView, Rules, memory_left_bytes
from agent.claims.inventory import (
    capacities,
    device_health,
    device_name,
    inventory,
    memory_capacity_bytes,
)
from agent.claims.start import check_settings
from agent.config.dra import DraSettings
from agent.core.errors import ConfigError
from agent.core.lease import Lease, LeaseState
from agent.core.quantity import quantity_bytes
from agent.core.types import Device, PriorityClass, ReasonCode
from agent.core.units import GIB, MIB
from agent.dra.port import Health
from tests.helpers import sim_settings

RULES = Rules(reserve_bytes=GIB, context_overhead_bytes=512 * MIB, thread_budget_pct=200)
DRA = DraSettings(clients_per_device=16, default_memory="8GiB", default_thread_pct=25)
H100 = Device("GPU-a", 0, "H100-SXM5-80GB", 80 * GIB, compute_capability=(9, 0))


def lease(memory_bytes: int, pct: float = 10, *, floor: float | None = None, i: int = 0) -> Lease:
    return Lease(
        f"l-{i}", f"r-{i}", "ns", "ns", H100.uuid, PriorityClass.BURSTABLE, memory_bytes, pct,
        LeaseState.ADMITTED, 0.0, 0.0, retention_floor=floor,
    )  # fmt: skip


def test_names_of_whole_gpus_and_mig_instances() -> None:
    mig = Device("MIG-1", 5, "H100 1g.10gb", 10 * GIB, parent_uuid="GPU-a", gpu_instance_id=7)
    assert device_name(H100, {}) == "gpu-0"
    assert device_name(mig, {"GPU-a": H100}) == "gpu-0-mig-7"


def test_memory_capacity_leaves_the_reserve_and_a_context_per_client() -> None:
    capacity = capacities(H100, RULES, DRA)
    assert capacity is not None
    memory = capacity["memory"]
    assert quantity_bytes(memory.value) == 80 * GIB - GIB - 16 * 512 * MIB == 71 * GIB
    assert memory.max == memory.value and memory.step == "1Mi" and memory.default == "8Gi"
    assert capacity["threads"].value == "200" and capacity["threads"].max == "100"
    assert capacity["clients"].json() == {
        "value": "16",
        "requestPolicy": {"default": "1", "validValues": ["1"]},
    }


@pytest.mark.parametrize("shares", [1, 4, 16])
def test_any_set_of_shares_the_scheduler_fits_fits_the_ledger(shares: int) -> None:
    """Split the published memory among ``shares`` clients: the ledger still has room for
    the last one (what the scheduler fits, the ledger admits)."""
    total = memory_capacity_bytes(H100, RULES, DRA.clients_per_device)
    each = total // shares
    held = tuple(lease(each, i=i) for i in range(shares - 1))
    assert memory_left_bytes(DeviceView(H100, held), RULES, extra_clients=1) >= each


@pytest.mark.parametrize(
    ("memory_gib", "clients", "memory"),
    [
        (80, 16, "71Gi"),  # the setting's 16
        (5, 5, "1536Mi"),  # a 1g.5gb MIG instance: 4 GiB after the reserve, 768 MiB a share
        (1.75, 0, None),  # not one share after the reserve: not published
    ],
)
def test_small_devices_take_fewer_shares_and_the_smallest_none(
    memory_gib: float, clients: int, memory: str | None
) -> None:
    device = dataclasses.replace(H100, memory_bytes=int(memory_gib * GIB))
    capacity = capacities(device, RULES, DRA)
    if memory is None:
        assert capacity is None
        assert inventory([DeviceView(device)], RULES, DRA).devices == ()
        return
    assert capacity is not None
    assert (capacity["clients"].value, capacity["memory"].value) == (str(clients), memory)


def test_a_thread_budget_of_one_is_one_valid_value() -> None:
    capacity = capacities(H100, dataclasses.replace(RULES, thread_budget_pct=1.5), DRA)
    assert capacity is not None
    assert capacity["threads"].json() == {
        "value": "1",
        "requestPolicy": {"default": "1", "validValues": ["1"]},
    }


@pytest.mark.parametrize(
    ("closed", "taint", "health"),
    [
        (None, None, Health.HEALTHY),
        (ReasonCode.DRAINING, "gpushare.io/drained", Health.HEALTHY),
        (ReasonCode.DEVICE_DEGRADED, "gpushare.io/degraded", Health.HEALTHY),
        (ReasonCode.DEVICE_UNAVAILABLE, "gpushare.io/mps-down", Health.UNHEALTHY),
        (ReasonCode.STORE_UNAVAILABLE, "gpushare.io/fault", Health.UNHEALTHY),
    ],
)
def test_closed_devices_carry_a_taint_and_faults_are_unhealthy(
    closed: ReasonCode | None, taint: str | None, health: Health
) -> None:
    view = DeviceView(H100, closed=closed, closed_detail="why")
    published = inventory([view], RULES, DRA)
    (device,) = published.devices
    assert [t.key for t in device.taints] == ([taint] if taint else [])
    assert all(t.effect == "NoSchedule" for t in device.taints)
    (told,) = device_health([view], "node-a", published.name_of)
    assert (told.pool_name, told.device_name, told.health) == ("node-a", "gpu-0", health)


def test_attributes_for_selectors() -> None:
    view = DeviceView(H100, (lease(GIB, 60, floor=0.9),))
    body = inventory([view], RULES, DRA).devices[0].json()
    attributes = body["attributes"]
    assert attributes["uuid"] == {"string": "GPU-a"}
    assert attributes["index"] == {"int": 0}
    assert attributes["computeCapability"] == {"version": "9.0.0"}
    assert attributes["trustDomain"] == {"string": "ns"}
    assert attributes["protected"] == {"bool": True}
    assert attributes["retentionHeadroom"] == {"string": "busy"}
    assert attributes["isolationFaults"] == {"string": "shared-with-trust-domain"}
    assert body["bindingConditions"] == ["gpushare.io/admitted"]
    assert body["bindingFailureConditions"] == ["gpushare.io/refused"]
    assert body["bindsToNode"] is True and body["allowMultipleAllocations"] is True


def test_without_binding_conditions() -> None:
    settings = dataclasses.replace(DRA, binding_conditions=False)
    body = inventory([DeviceView(H100)], RULES, settings).devices[0].json()
    assert "bindingConditions" not in body and "bindsToNode" not in body
    assert body["attributes"]["retentionHeadroom"] == {"string": "quiet"}


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"runtime.node_name": ""}, "dra.enabled"),
        ({"dra.default_memory": "lots"}, "dra.default_memory"),
        ({"dra.clients_per_device": 64}, "dra.clients_per_device"),
    ],
)
def test_settings_the_driver_refuses_name_themselves(
    tmp_path: Path, overrides: dict[str, object], key: str
) -> None:
    settings = sim_settings(tmp_path, **{"dra.enabled": True, **overrides})
    with pytest.raises(ConfigError) as info:
        check_settings(settings)
    assert key in str(info.value)
