"""Reading a ResourceClaim's allocation: this driver's shares on this node, its opaque
config, the binding answers still owed, and the status the driver writes back."""

from __future__ import annotations

from typing import Any

import pytest

from agent.dra.claims import (
    ClaimError,
    Share,
    ShareConfig,
    condition,
    pending_conditions,
    reserved_pods,
    results_here,
    share_config,
    shares,
    with_device_status,
)

DRIVER, NODE = "gpushare.io", "node-a"


def result(device: str = "gpu-0", **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device, **extra}


def claim(results: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"},
        "status": {"allocation": {"devices": {"results": results}}, **status},
    }


SHARE_CASES = [
    ("not allocated", {"metadata": {"uid": "u"}}, []),
    (
        "consumed capacity read exactly",
        claim([result(shareID="s1", consumedCapacity={"memory": "20Gi", "threads": "25"})]),
        [Share("gpu", "gpu-0", "s1", 20 * 2**30, 25.0)],
    ),
    (
        "fractional bytes round up",
        claim([result(shareID="s1", consumedCapacity={"memory": "1.0000001Gi"})]),
        [Share("gpu", "gpu-0", "s1", 2**30 + 108, None)],
    ),
    (
        "adminAccess results are not shares",
        claim([result(adminAccess=True), result("gpu-1")]),
        [Share("gpu", "gpu-1", "", None, None)],
    ),
    (
        "other drivers and other pools are skipped",
        claim([result(driver="gpu.nvidia.com"), result(pool="node-b"), result("gpu-1")]),
        [Share("gpu", "gpu-1", "", None, None)],
    ),
    (
        "a subrequest counts as its request",
        claim([result(request="gpu/small", shareID="s")]),
        [Share("gpu", "gpu-0", "s", None, None)],
    ),
    (
        "binding conditions are kept",
        claim([result(shareID="s", bindingConditions=["gpushare.io/admitted"])]),
        [Share("gpu", "gpu-0", "s", None, None, ("gpushare.io/admitted",))],
    ),
]


@pytest.mark.parametrize(("why", "obj", "expected"), SHARE_CASES)
def test_shares(why: str, obj: dict[str, Any], expected: list[Share]) -> None:
    assert shares(obj, DRIVER, NODE) == expected, why


def test_an_unreadable_consumed_capacity_is_a_claim_error() -> None:
    with pytest.raises(ClaimError, match="gpu-0"):
        shares(claim([result(consumedCapacity={"memory": "lots"})]), DRIVER, NODE)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"consumedCapacity": {"threads": "150"}}, "threads '150' is outside"),
        ({"consumedCapacity": {"threads": "-50"}}, "threads '-50' is outside"),
        ({"consumedCapacity": {"threads": "0"}}, "threads '0' is outside"),
        ({"consumedCapacity": {"memory": "512Ki"}}, "memory '512Ki' is outside"),
        ({"consumedCapacity": {"memory": "0"}}, "memory '0' is outside"),
        ({"consumedCapacity": {"memory": "2Pi"}}, "memory '2Pi' is outside"),
        ({"consumedCapacity": "20Gi"}, "not an object"),
        ({"device": "gpu\n0"}, "device"),
        ({"shareID": "s" * 200}, "shareID"),
        ({"request": "gpu\x1b[31m"}, "request"),
    ],
)
def test_what_mps_cannot_hold_or_admit_would_refuse_is_a_claim_error(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ClaimError, match=message) as refused:
        shares(claim([result(**fields)]), DRIVER, NODE)
    assert "\n" not in str(refused.value) and "\x1b" not in str(refused.value)


def test_results_here_holds_shares_and_admin_access_and_nothing_of_others() -> None:
    obj = claim(
        [result(adminAccess=True), result("gpu-1", shareID="s"), result(driver="gpu.other.io")]
    )
    found = results_here(obj, DRIVER, NODE)
    assert [(s.device, s.admin) for s in found] == [("gpu-0", True), ("gpu-1", False)]


def test_share_keys_tell_shares_apart() -> None:
    assert Share("gpu", "gpu-0", "s1", None, None).key == "s1"
    assert Share("gpu", "gpu-0", "", None, None).key == "gpu-gpu-0"


def config(*parameters: dict[str, Any], driver: str = DRIVER) -> dict[str, Any]:
    obj = claim([result()])
    obj["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": driver, "parameters": p}} for p in parameters
    ]
    return obj


SC = {"apiVersion": "gpushare.io/v1", "kind": "ShareConfig"}
CONFIG_CASES = [
    ("none: defaults", config(), ShareConfig()),
    ("priority", config({**SC, "priority": "guaranteed"}), ShareConfig("guaranteed")),
    (
        "later entries win field by field",
        config({**SC, "priority": "guaranteed"}, {**SC, "retentionFloor": 0.9}),
        ShareConfig("guaranteed", None, 0.9),
    ),
    ("another driver's config is not ours", config({"x": 1}, driver="other.io"), ShareConfig()),
]


@pytest.mark.parametrize(("why", "obj", "expected"), CONFIG_CASES)
def test_share_config(why: str, obj: dict[str, Any], expected: ShareConfig) -> None:
    assert share_config(obj, DRIVER, "gpu") == expected, why


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"kind": "Other"}, "must be gpushare.io/v1 ShareConfig"),
        ({**SC, "priority": "urgent"}, "priority must be one of"),
        ({**SC, "retentionFloor": 1.5}, "retentionFloor"),
        ({**SC, "trustDomain": "other"}, "unknown fields"),
        ({**SC, "profile": "llm\x00serve"}, "profile"),
        ({**SC, "profile": "p" * 5000}, "profile"),
        ({**SC, "retentionFloor": True}, "retentionFloor"),
    ],
)
def test_bad_share_configs_are_refused(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        share_config(config(parameters), DRIVER, "gpu")


def test_reserved_pods() -> None:
    obj = claim([], reservedFor=[{"resource": "pods", "name": "p", "uid": "pu"}, {"resource": "x"}])
    assert reserved_pods(obj) == [("p", "pu")]


def test_binding_answers_owed_and_written() -> None:
    conditions = {"bindingConditions": ["gpushare.io/admitted"]}
    obj = claim(
        [result("gpu-0", shareID="s0", **conditions), result("gpu-1", shareID="s1", **conditions)]
    )
    waiting = pending_conditions(obj, DRIVER, NODE)
    assert [s.share_id for s in waiting] == ["s0", "s1"]
    yes = condition("gpushare.io/admitted", "Admitted", "ok", "2026-01-01T00:00:00Z")
    answered = with_device_status(obj, DRIVER, NODE, [(waiting[0], yes)])
    assert [s.share_id for s in pending_conditions(answered, DRIVER, NODE)] == ["s1"]
    again = with_device_status(answered, DRIVER, NODE, [(waiting[0], yes)])
    assert len(again["status"]["devices"]) == 1  # replaced, not added twice
    assert again["status"]["devices"][0] == {
        "driver": DRIVER,
        "pool": NODE,
        "device": "gpu-0",
        "shareID": "s0",
        "conditions": [yes],
    }


def test_admin_access_results_are_not_shares() -> None:
    obj = claim([result("gpu-0", adminAccess=True), result("gpu-1")])
    assert [s.device for s in shares(obj, DRIVER, NODE)] == ["gpu-1"]


def test_a_config_entry_naming_requests_applies_to_those_only() -> None:
    obj = config()
    obj["status"]["allocation"]["devices"]["config"] = [
        {
            "requests": ["big"],
            "opaque": {"driver": DRIVER, "parameters": {**SC, "priority": "guaranteed"}},
        },
        {"opaque": {"driver": DRIVER, "parameters": {**SC, "profile": "etl-batch"}}},
    ]
    assert share_config(obj, DRIVER, "big") == ShareConfig("guaranteed", "etl-batch")
    assert share_config(obj, DRIVER, "gpu") == ShareConfig("burstable", "etl-batch")
