"""The retention gate, with the shipped model and with the fallback rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.admission.policy import DeviceView, Rules, decide
from agent.core.lease import Lease, LeaseState
from agent.core.types import AdmissionRequest, Device, PriorityClass, ReasonCode
from agent.core.units import GIB
from agent.estimator.model import DEFAULT_MODEL_DIR, RetentionModel
from agent.estimator.profiles import load_profiles
from agent.learning.gate import FALLBACK, ProfileGate

PROFILES = load_profiles(Path(__file__).parents[3] / "profiles")
DEVICE = Device("GPU-0", 0, "A100-SXM4-80GB", 80 * GIB)
RULES = Rules()


def lease(lease_id: str, profile: str, thread_pct: float, floor: float | None = None) -> Lease:
    return Lease(
        lease_id,
        f"r-{lease_id}",
        "t",
        "a",
        "GPU-0",
        PriorityClass.BURSTABLE,
        8 * GIB,
        thread_pct,
        LeaseState.ADMITTED,
        0.0,
        0.0,
        profile=profile,
        retention_floor=floor,
    )


def request(
    profile: str | None, thread_pct: float = 50, floor: float | None = None
) -> AdmissionRequest:
    return AdmissionRequest(
        "new",
        "t",
        "a",
        PriorityClass.BURSTABLE,
        8 * GIB,
        thread_pct,
        profile=profile,
        retention_floor=floor,
    )


def test_the_shipped_profiles_load() -> None:
    assert {"resnet50-train", "bert-infer", "llm-7b-serve", "etl-batch"} <= set(PROFILES)
    assert PROFILES["bert-infer"].retention_floor == 0.9


@pytest.mark.parametrize("model", [None, "default"])
def test_a_protected_lease_under_its_floor_blocks_and_is_named(model: str | None) -> None:
    gate = ProfileGate(RetentionModel.load(DEFAULT_MODEL_DIR) if model else None, PROFILES)
    view = DeviceView(DEVICE, (lease("l-serve", "llm-7b-serve", 100, floor=0.99),))
    verdict = gate(view, request(None, 100))  # no profile: no floor of its own
    assert not verdict.ok
    assert "lease l-serve" in verdict.detail and "0.99" in verdict.detail
    assert set(verdict.predictions) == {"candidate", "l-serve"}
    decision = decide(request(None, 100), [view], RULES, now=0, gate=gate)
    assert decision.reason is ReasonCode.RETENTION_BELOW_FLOOR
    assert decision.attempts[0].predictions == verdict.predictions


def test_unprotected_sets_pass_and_the_answer_says_which_estimator() -> None:
    gate = ProfileGate(None, PROFILES)
    view = DeviceView(DEVICE, (lease("l-etl", "etl-batch", 25),))
    decision = decide(request(None, 100), [view], RULES, now=0, gate=gate.explaining())
    assert decision.admitted and decision.estimator == FALLBACK
    # etl's 30% + an unprofiled full-thread workload's 88% of gpu_util: each keeps 100/118
    assert decision.predictions["candidate"] == pytest.approx(100 / 118, abs=1e-3)


def test_admission_skips_the_prediction_where_no_floor_could_refuse() -> None:
    gate = ProfileGate(None, PROFILES)
    view = DeviceView(DEVICE, (lease("l-etl", "etl-batch", 25),))
    assert PROFILES["etl-batch"].retention_floor is None
    decision = decide(request(None, 100), [view], RULES, now=0, gate=gate)
    assert decision.admitted and decision.predictions == {}
    floored = decide(request(None, 100, floor=0.5), [view], RULES, now=0, gate=gate)
    assert "candidate" in floored.predictions, "a floor brings the prediction back"


def test_the_candidate_floor_counts_too_and_empty_devices_skip_the_gate() -> None:
    gate = ProfileGate(None, PROFILES)
    busy = DeviceView(DEVICE, (lease("l-rn", "resnet50-train", 100),))
    refused = decide(request("resnet50-train", floor=0.9), [busy], RULES, now=0, gate=gate)
    assert refused.reason is ReasonCode.RETENTION_BELOW_FLOOR
    assert "the candidate" in refused.attempts[0].detail
    empty = decide(
        request("resnet50-train", floor=0.99), [DeviceView(DEVICE)], RULES, now=0, gate=gate
    )
    assert empty.admitted and not empty.predictions


def test_the_model_predicts_light_neighbours_keep_more_than_heavy_ones() -> None:
    gate = ProfileGate(RetentionModel.load(DEFAULT_MODEL_DIR), PROFILES)
    protected = DeviceView(DEVICE, (lease("l-bert", "bert-infer", 25),))
    light = gate(protected, request("etl-batch", 25)).predictions["l-bert"]
    # resnet50 at full threads oversubscribes the SMs next to bert's 25%; the LLM's memory
    # traffic still fits beside bert's (in the contention model both keep bert at 0.71)
    heavy = gate(protected, request("resnet50-train", 100)).predictions["l-bert"]
    assert 0.0 <= heavy < light <= 1.1


@pytest.mark.parametrize(
    ("measured_sm", "measured_dram", "extra_sm", "extra_dram"),
    [
        (0.30, 0.10, None, None),  # as declared (0.1 + 0.2 sm, 0.05 + 0.05 dram)
        (0.31, 0.11, None, None),  # within the 0.02 noise allowance
        (0.70, 0.10, 0.40, 0.0),  # busier than declared: the rest is one more peer
        (0.30, 0.60, 0.0, 0.50),
        (0.10, 0.00, None, None),  # quieter than declared: nothing unattributed
    ],
)
def test_unattributed_load_is_what_the_signatures_do_not_explain(
    measured_sm: float, measured_dram: float, extra_sm: float | None, extra_dram: float | None
) -> None:
    from agent.estimator.records import Workload
    from agent.learning.gate import unattributed

    declared = [
        Workload("a", 50, GIB, {"sm_active": 0.1, "dram_active": 0.05}),
        Workload("b", 50, GIB, {"sm_active": 0.2, "dram_active": 0.05}),
    ]
    extra = unattributed(declared, {"sm_active": measured_sm, "dram_active": measured_dram})
    if extra_sm is None:
        assert extra is None
        return
    assert extra is not None
    assert extra.counters["sm_active"] == pytest.approx(extra_sm)
    assert extra.counters["dram_active"] == pytest.approx(extra_dram)


@pytest.mark.parametrize("model", [None, "default"])
def test_live_estimates_fall_when_the_device_is_busier_than_declared(model: str | None) -> None:
    gate = ProfileGate(RetentionModel.load(DEFAULT_MODEL_DIR) if model else None, PROFILES)
    leases = (
        lease("p", "llm-inference", 40, floor=0.9),
        lease("q", "resnet50-training", 40),
    )
    view = DeviceView(DEVICE, leases)
    quiet = gate.estimate_live(view, {"sm_active": 0.0, "dram_active": 0.0})
    busy = gate.estimate_live(view, {"sm_active": 1.0, "dram_active": 1.0})
    assert quiet == gate.estimate(view), "nothing unattributed: the admission-time estimate"
    assert busy["p"] < quiet["p"] and busy["q"] <= quiet["q"]
    assert set(busy) == {"p", "q"}, "the unattributed peer is not a lease"


def test_the_gate_states_and_applies_its_coverage() -> None:
    model = RetentionModel.load(DEFAULT_MODEL_DIR)
    loose = ProfileGate(model, PROFILES, coverage=0.6)
    strict = ProfileGate(model, PROFILES, coverage=0.99)
    assert "60% coverage" in loose.name and "99% coverage" in strict.name
    view = DeviceView(DEVICE, (lease("l-bert", "bert-infer", 25, floor=0.5),))
    ask = request("resnet50-train", 50)
    assert strict(view, ask).predictions["l-bert"] <= loose(view, ask).predictions["l-bert"]
    assert ProfileGate(model, PROFILES).name.endswith(f"{model.coverage:.0%} coverage")


def test_the_gate_decides_on_p_keep_at_its_precision() -> None:
    model = RetentionModel.load(DEFAULT_MODEL_DIR)
    gate = ProfileGate(model, PROFILES, gate_precision=0.95)
    assert "P(retention >= floor) at precision 0.95" in gate.name
    view = DeviceView(DEVICE, (lease("l-rn", "resnet50-train", 100, floor=0.8),))
    decided = set()
    for candidate in ("etl-batch", None):  # neither has a floor of its own
        for threads in (10, 25, 50, 75, 100):
            verdict = gate(view, request(candidate, threads))
            workloads = [
                gate.lease_workload(view.leases[0]),
                gate.lease_workload(lease("c", candidate, threads)),
            ]
            found = model.estimate_set(DEVICE.model, DEVICE.memory_bytes, workloads[::-1])
            p = model.p_keep(found.mean[1:], found.spread[1:], 0.8)[0]
            threshold = model.threshold(0.8, 0.95)
            assert verdict.ok == (threshold is not None and p >= threshold), (candidate, threads)
            decided.add(verdict.ok)
            if not verdict.ok:
                assert "lease l-rn" in verdict.detail
                assert "P(keeping its floor 0.80)" in verdict.detail
                assert f"the gate needs {threshold:.2f} at precision 0.95" in verdict.detail
    assert decided == {True, False}, "some sets pass, some do not"


def test_a_higher_precision_never_admits_more() -> None:
    model = RetentionModel.load(DEFAULT_MODEL_DIR)
    for floor in (0.6, 0.8, 0.85, 0.875, 0.9):
        thresholds = [model.threshold(floor, p) for p in (0.8, 0.9, 0.95, 0.99)]
        known = [t if t is not None else 2.0 for t in thresholds]
        assert known == sorted(known), floor


def test_a_swapped_model_reaches_admission_and_explain_at_once() -> None:
    model = RetentionModel.load(DEFAULT_MODEL_DIR)
    gate = ProfileGate(None, PROFILES, coverage=0.8)
    explaining = gate.explaining()
    assert gate.name == FALLBACK == explaining.name
    gate.use_model(model)
    assert gate.model is explaining.model and gate.model is not None
    assert gate.model.coverage == 0.8, "the configured coverage applies to the new model"
    assert "model " in explaining.name and "80% coverage" in explaining.name


def test_a_gate_deciding_on_a_rule_reports_the_learned_estimate_and_names_the_rule(
    tmp_path: Path,
) -> None:
    from agent.estimator.synthetic import family_shift_runs
    from agent.estimator.training import save, train

    records = family_shift_runs(400, seed=4)
    result = train(records, folds=0, trees=15, seed=0, check_constraints=False)
    assert result.decision is not None, result.cv["gate_choice"]["reason"]
    save(result, tmp_path, data_sha256="t", records=len(records), provenance="test")
    model = RetentionModel.load(tmp_path)
    assert model.decides_on == result.cv["gate_choice"]["estimate"].split("@")[0]
    found = model.estimate(records[:200])
    assert found.decided is not None and found.doubt is not None
    # what is shown stays the learned estimate; the gate decides on its own
    assert not (found.mean == found.decided).all()
    p, admitted = model.admits(found, 0.85, 0.95)
    assert (p == model.p_keep(found.decided, found.doubt, 0.85)).all()
    refused = int((~admitted).nonzero()[0][0])
    gate = ProfileGate(model, PROFILES, gate_precision=0.95)
    why = gate._refusal(model, found, refused, 0.85)
    assert f"on the {model.decides_on} estimate" in why and "driven most by" in why
    assert found.term[refused] in why
