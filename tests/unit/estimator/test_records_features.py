import json

import pytest

from agent.core.errors import ValidationError
from agent.estimator.features import (
    counter_names,
    feature_names,
    features,
    model_class,
    monotonic,
)
from agent.estimator.records import parse_lines, to_json

EXAMPLE = {
    "gpu": {"model": "V100-SXM2-16GB", "memory_bytes": 17179869184},
    "target": {
        "workload": "resnet50-bs32",
        "thread_pct": 100,
        "memory_bytes": 4294967296,
        "counters": {"gpu_util": 92.0, "mem_util": 41.0, "fb_used_bytes": 3.2e9},
    },
    "peers": [
        {
            "workload": "lstm-bs64",
            "thread_pct": 100,
            "memory_bytes": 2147483648,
            "counters": {"gpu_util": 55.0, "mem_util": 20.0, "fb_used_bytes": 1.9e9},
        }
    ],
    "device_counters": {"gpu_util": 98.0, "mem_util": 60.0, "fb_used_bytes": 5.1e9},
    "retention": 0.87,
}


def test_the_documented_example_round_trips() -> None:
    (record,) = parse_lines([json.dumps(EXAMPLE)], need_retention=True)
    assert record.retention == 0.87 and record.peers[0].workload == "lstm-bs64"
    assert json.loads(to_json(record)) == {
        **EXAMPLE,
        "target": {**EXAMPLE["target"], "thread_pct": 100.0},
        "peers": [{**EXAMPLE["peers"][0], "thread_pct": 100.0}],
    }


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda d: d.pop("gpu"), "line 2: gpu"),
        (lambda d: d["target"].update(thread_pct=150), "line 2: target.thread_pct"),
        (
            lambda d: d["target"]["counters"].update(gpu_util="high"),
            "line 2: target.counters.gpu_util",
        ),
        (lambda d: d.pop("retention"), "line 2: retention"),
        (lambda d: d["peers"][0].pop("workload"), "line 2: peers[0].workload"),
        (lambda d: d.update(peers={}), "line 2: peers"),
    ],
)
def test_bad_records_name_line_and_field(change: object, where: str) -> None:
    bad = json.loads(json.dumps(EXAMPLE))
    change(bad)  # type: ignore[operator]
    with pytest.raises(ValidationError) as info:
        parse_lines([json.dumps(EXAMPLE), json.dumps(bad)], need_retention=True)
    assert info.value.field == where


def test_not_json_names_the_line() -> None:
    with pytest.raises(ValidationError, match="line 3"):
        parse_lines(["", json.dumps(EXAMPLE), "{oops"], need_retention=False)


def test_predict_does_not_need_retention() -> None:
    record = dict(EXAMPLE)
    record.pop("retention")
    assert parse_lines([json.dumps(record)], need_retention=False)[0].retention is None


def test_peer_order_does_not_matter_and_missing_counters_read_zero() -> None:
    three = json.loads(json.dumps(EXAMPLE))
    three["peers"].append(
        {"workload": "bert", "thread_pct": 50, "memory_bytes": 1, "counters": {"gpu_util": 70.0}}
    )
    swapped = json.loads(json.dumps(three))
    swapped["peers"].reverse()
    a, b = parse_lines([json.dumps(three), json.dumps(swapped)], need_retention=True)
    names = feature_names(*counter_names([a]))
    assert features(a, names) == features(b, names)
    values = dict(zip(names, features(a, names), strict=True))
    assert values["p.count"] == 2 and values["p.sum.gpu_util"] == 125.0
    assert values["p.max.gpu_util"] == 70.0 and values["p.thread_pct_sum"] == 150.0
    assert values["p.sum.mem_util"] == 20.0, "a missing counter counts as 0"
    assert values["d.class"] == model_class("V100")
    assert not [n for n in names if n.startswith("dc.")], "device counters are not features"


def test_physics_features_of_the_documented_example() -> None:
    (record,) = parse_lines([json.dumps(EXAMPLE)], need_retention=True)
    names = feature_names(*counter_names([record]))
    values = dict(zip(names, features(record, names), strict=True))
    device = 17179869184
    expected = {
        "x.sm_total": 0.92 + 0.55,  # gpu_util / 100 when sm_active is missing
        "x.sm_peers": 0.55,
        "x.sm_share": 0.92 / 1.47,
        "x.dram_total": 0.41 + 0.20,
        "x.mem_total": (3.2e9 + 1.9e9) / device,  # memory used, not the limits
        "x.mem_peers": 1.9e9 / device,
        "x.threads_total": 2.0,
        "x.threads_share": 0.5,
        "x.headroom": 1 - 1.47,
        "x.util_sum": 147.0,
    }
    for name, value in expected.items():
        assert values[name] == pytest.approx(value), name


@pytest.mark.parametrize(
    ("name", "direction"),
    [
        ("x.sm_total", -1),
        ("x.dram_peers", -1),
        ("x.util_sum", -1),
        ("p.sum.gpu_util", -1),
        ("p.max.mem_util", -1),
        ("p.thread_pct_sum", -1),
        ("p.count", -1),
        ("x.headroom", 1),
        ("x.sm_share", 0),
        ("t.gpu_util", 0),
        ("p.sum.temperature_c", 0),  # not a load: the physics does not say
        ("d.class", 0),
    ],
)
def test_monotonic_directions(name: str, direction: int) -> None:
    assert monotonic(name) == direction


def test_family_is_an_optional_field_that_round_trips() -> None:
    document = json.loads(json.dumps(EXAMPLE))
    document["target"]["family"] = "resnet"
    (record,) = parse_lines([json.dumps(document)], need_retention=True)
    assert record.target.family == "resnet" and record.peers[0].family == ""
    again = json.loads(to_json(record))
    assert again["target"]["family"] == "resnet" and "family" not in again["peers"][0]


def test_model_classes_order_generations() -> None:
    assert model_class("K80") < model_class("V100-SXM2") < model_class("NVIDIA H100 80GB HBM3")
    assert model_class("mystery") == 0


SHARES = {
    "gpu": {"model": "NVIDIA A100-SXM4-40GB", "memory_bytes": 40 * 2**30},
    "target": {
        "workload": "bert-bs8",
        "family": "bert",
        "thread_pct": 30,
        "memory_bytes": 2**31,
        "counters": {"l2_util": 60.0, "dram_util": 50.0},
        "share_counters": {"30": {"l2_util": 40.0, "dram_util": 30.0}, "70": {"l2_util": 55.0}},
    },
    "peers": [
        {
            "workload": "yolo-bs1",
            "thread_pct": 80,
            "memory_bytes": 2**30,
            "counters": {"l2_util": 20.0, "dram_util": 70.0},
        }
    ],
    "retention": 0.8,
}


def test_counters_at_the_share_feed_the_mps_share_features() -> None:
    (record,) = parse_lines([json.dumps(SHARES)], need_retention=True)
    assert record.target.share_counters[30.0] == {"l2_util": 40.0, "dram_util": 30.0}
    names = feature_names(*counter_names([record]))
    assert "x.util_sum" not in names, "no gpu_util: no column the sum rule could be read into"
    values = dict(zip(names, features(record, names), strict=True))
    expected = {
        "t.l2_util": 40.0,  # measured at its 30% share, not at the full device
        "t.dram_util": 30.0,
        "s.l2_util": 40.0 + 20.0,
        "x.l2_total": 0.4 + 0.2,
        "x.l2_peers": 0.2,
        "x.dram_total": 0.3 + 0.7,  # dram_util when neither dram_active nor mem_util
        "x.memsys_total": 0.6 + 1.0,
        "x.memsys_peers": 0.2 + 0.7,
        "x.threads_total": 1.1,
        "x.threads_over": pytest.approx(0.1),
    }
    for name, value in expected.items():
        assert values[name] == pytest.approx(value), name
    again = json.loads(to_json(record))
    assert again["target"]["share_counters"] == SHARES["target"]["share_counters"]


@pytest.mark.parametrize(
    ("thread_pct", "l2"),
    [(30, 40.0), (25, 40.0), (50, 55.0), (100, 55.0), (10, 40.0)],
)
def test_the_nearest_measured_share_is_used(thread_pct: float, l2: float) -> None:
    from agent.estimator.records import Workload, counters_at_share

    workload = Workload(
        "w",
        thread_pct,
        0,
        {"l2_util": 99.0, "gpu_util": 50.0},
        "",
        {30.0: {"l2_util": 40.0}, 70.0: {"l2_util": 55.0}},
    )
    at_share = counters_at_share(workload)
    assert at_share["l2_util"] == l2 and at_share["gpu_util"] == 50.0


@pytest.mark.parametrize(
    ("shares", "where"),
    [
        ({"half": {}}, "target.share_counters.half"),
        ({"0": {}}, "target.share_counters.0"),
        ({"150": {}}, "target.share_counters.150"),
        ({"50": {"l2_util": "x"}}, "target.share_counters.50.l2_util"),
    ],
)
def test_bad_share_counters_name_the_field(shares: dict[str, object], where: str) -> None:
    document = json.loads(json.dumps(SHARES))
    document["target"]["share_counters"] = shares
    with pytest.raises(ValidationError, match=where.replace(".", r"\.")):
        parse_lines([json.dumps(document)], need_retention=True)


def test_a_profile_measured_at_shares_reaches_the_gate(tmp_path: object) -> None:
    from agent.estimator.profiles import parse_profile
    from agent.learning.gate import _workload

    profile = parse_profile(
        "version: 1\nname: bert\ngpu_model: A100\ncounters: {sm_active: 0.9}\n"
        "share_counters:\n  25: {sm_active: 0.2}\n",
        "bert.yaml",
    )
    assert profile.share_counters == {25.0: {"sm_active": 0.2}}
    from agent.estimator.records import counters_at_share

    at_25 = _workload("l", "bert", 25, 0, {"bert": profile}, {})
    assert counters_at_share(at_25)["sm_active"] == 0.2
    inline = _workload("l", "bert", 25, 0, {"bert": profile}, {"sm_active": 0.5})
    assert counters_at_share(inline)["sm_active"] == 0.5, "counters sent inline win"
    with pytest.raises(ValidationError, match="share_counters"):
        parse_profile(
            "version: 1\nname: b\ngpu_model: A\ncounters: {x: 1}\nshare_counters: [1]\n", "b.yaml"
        )


def test_the_retention_basis_round_trips_and_defaults_to_the_device() -> None:
    (plain,) = parse_lines([json.dumps(EXAMPLE)], need_retention=True)
    assert plain.retention_basis == "device"
    assert "retention_basis" not in json.loads(to_json(plain)), "files stay as they were"
    document = {**json.loads(json.dumps(EXAMPLE)), "retention_basis": "share"}
    (shared,) = parse_lines([json.dumps(document)], need_retention=True)
    assert shared.retention_basis == "share"
    assert json.loads(to_json(shared))["retention_basis"] == "share"
    with pytest.raises(ValidationError, match="line 1: retention_basis"):
        parse_lines([json.dumps({**document, "retention_basis": "solo"})], need_retention=True)
