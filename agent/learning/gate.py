"""The retention gate (DESIGN section 3): before a request joins an occupied device, predict
the retention of the request and of every lease already there with the request added, and
admit only if each prediction meets that workload's floor.

With a model, each protected workload (one with a floor) is admitted when P(retention >=
its floor) reaches the model's threshold for that floor at the gate's precision (the
setting ``estimator.gate_precision``): of the sets admitted so, that share keep their floors
in the model's grouped cross-validation. The numbers shown (Explain, estimates) are the
explained conservative ``retention_lower`` at the model's coverage (``estimator.coverage``).
A model from before operating points gates on ``retention_lower >= floor`` and says so.
A model whose gate decides on another estimate than the one it reports (a one-line rule or
the monotone base of aggregate pressure, chosen in training for what held on families it
never saw: ``estimator.training``) computes P(keep) from that estimate, and a refusal names
it and the pressure term that weighs most in it. Without a model the fallback is the
utilisation-sum rule: the set keeps ``min(1, 100 / sum of gpu_util)``, and every answer
says which was used. A workload's
counters are those sent with the request, else its profile's (at its thread share, where
the profile measured one); without either it is modelled as keeping 80% of its thread
share busy.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.admission.policy import DeviceView
from agent.core.lease import Lease
from agent.core.types import AdmissionRequest, RetentionVerdict
from agent.estimator.features import busy_shares
from agent.estimator.model import Estimates, RetentionModel
from agent.estimator.operating import DEFAULT_PRECISION
from agent.estimator.profiles import Profile
from agent.estimator.records import Workload

FALLBACK = "fallback: utilisation-sum rule (no retention model loaded)"


def _workload(
    name: str,
    profile: str | None,
    thread_pct: float,
    memory_bytes: int,
    profiles: Mapping[str, Profile],
    inline: Mapping[str, float],
) -> Workload:
    known = profiles.get(profile or "")
    shares = known.share_counters if known is not None and not inline else {}
    return Workload(
        name,
        thread_pct,
        memory_bytes,
        solo_counters(profile, thread_pct, profiles, inline),
        "",
        shares,
    )


def solo_counters(
    profile: str | None,
    thread_pct: float,
    profiles: Mapping[str, Profile],
    inline: Mapping[str, float],
) -> dict[str, float]:
    """A workload's solo signature: sent inline, else its profile's, else a default that
    keeps 80% of its thread share of the SMs busy and a third of that on the memory bus."""
    if inline:
        return dict(inline)
    known = profiles.get(profile or "")
    if known is not None:
        return dict(known.counters)
    busy = min(1.0, 0.8 * thread_pct / 100.0)
    return {
        "sm_active": busy,
        "dram_active": busy / 3,
        "gpu_util": min(100.0, busy * 110),
        "mem_util": busy * 33,
    }


def _model_name(model: RetentionModel, precision: float) -> str:
    name = (
        f"model {model.metadata.get('data_sha256', '?')[:12]} "
        f"({model.metadata.get('provenance', 'unknown data')})"
    )
    lower = f"lower estimate at {model.coverage:.0%} coverage" if model.coverage else ""
    if not model.has_operating_point:
        return f"{name}, gate on the {lower or 'lower estimate'} (no operating point: retrain it)"
    return ", ".join(
        part
        for part in (name, f"gate on P(retention >= floor) at precision {precision:.2f}", lower)
        if part
    )


class _Shared:
    """What a gate and its explaining twin share, so a model swap reaches both at once."""

    def __init__(
        self, model: RetentionModel | None, coverage: float | None, precision: float
    ) -> None:
        self.coverage, self.precision = coverage, precision
        self.model: RetentionModel | None = None
        self.name = FALLBACK
        self.use(model)

    def use(self, model: RetentionModel | None) -> None:
        if model is not None and self.coverage is not None and model.coverage is not None:
            model = model.with_coverage(self.coverage)
        # one assignment each, read together by the event loop's single thread
        self.model = model
        self.name = FALLBACK if model is None else _model_name(model, self.precision)


class ProfileGate:
    """The retention gate. ``always_predict=False`` (admission's hot path) skips the
    prediction on a device where neither the request nor any lease has a floor: nothing
    could be refused; Explain uses :meth:`explaining`, which always predicts."""

    def __init__(
        self,
        model: RetentionModel | None,
        profiles: Mapping[str, Profile],
        *,
        always_predict: bool = False,
        coverage: float | None = None,
        gate_precision: float = DEFAULT_PRECISION,
        shared: _Shared | None = None,
    ) -> None:
        self._shared = shared or _Shared(model, coverage, gate_precision)
        self.profiles = profiles
        self.always_predict = always_predict

    @property
    def model(self) -> RetentionModel | None:
        return self._shared.model

    @property
    def name(self) -> str:
        return self._shared.name

    @property
    def precision(self) -> float:
        return self._shared.precision

    def use_model(self, model: RetentionModel) -> None:
        """Swap the model (a retrain on the node): admission and Explain use it from the
        next decision on."""
        self._shared.use(model)

    def floor_of(self, profile: str | None, stated: float | None) -> float | None:
        if stated:
            return stated
        known = self.profiles.get(profile or "")
        return known.retention_floor if known is not None else None

    def explaining(self) -> ProfileGate:
        return ProfileGate(None, self.profiles, always_predict=True, shared=self._shared)

    def _no_floor(self, view: DeviceView, request: AdmissionRequest) -> bool:
        if self.floor_of(request.profile, request.retention_floor) is not None:
            return False
        return all(self.floor_of(x.profile, x.retention_floor) is None for x in view.leases)

    def __call__(self, view: DeviceView, request: AdmissionRequest) -> RetentionVerdict:
        if not self.always_predict and self._no_floor(view, request):
            return RetentionVerdict(True, {}, f"{self.name}; no floor on the device")
        candidate = _workload(
            "candidate",
            request.profile,
            request.thread_pct,
            request.memory_bytes,
            self.profiles,
            request.counters,
        )
        members: list[tuple[str, Workload, float | None]] = [
            ("candidate", candidate, self.floor_of(request.profile, request.retention_floor))
        ]
        for lease in view.leases:
            members.append(
                (
                    lease.lease_id,
                    self.lease_workload(lease),
                    self.floor_of(lease.profile, lease.retention_floor),
                )
            )
        model = self.model
        if model is None:
            return self._rule_verdict(view, members)
        found = model.estimate_set(
            view.device.model, view.device.memory_bytes, [m[1] for m in members]
        )
        named = {
            name: round(float(value), 4)
            for (name, _w, _f), value in zip(members, found.lower, strict=True)
        }
        for at, (name, _w, floor) in enumerate(members):
            if floor is None:
                continue
            refusal = self._refusal(model, found, at, floor)
            if refusal:
                who = "the candidate" if name == "candidate" else f"lease {name}"
                return RetentionVerdict(False, named, f"{who} {refusal} ({self.name})")
        return RetentionVerdict(True, named, self.name)

    def _refusal(self, model: RetentionModel, found: Estimates, at: int, floor: float) -> str:
        """Why member ``at`` breaks the gate at ``floor``; "" when it passes."""
        mean, lower = float(found.mean[at]), float(found.lower[at])
        if not model.has_operating_point:
            if lower >= floor:
                return ""
            return f"would keep {lower:.2f} of its solo speed, under its floor {floor:.2f}"
        p = float(
            model.p_keep(found.gate_mean[at : at + 1], found.gate_spread[at : at + 1], floor)[0]
        )
        threshold = model.threshold(floor, self.precision)
        if threshold is not None and p >= threshold:
            return ""
        needed = "no chance is enough" if threshold is None else f"the gate needs {threshold:.2f}"
        return (
            f"would keep {mean:.2f} of its solo speed (at least {lower:.2f}); "
            f"P(keeping its floor {floor:.2f}) = {p:.2f}{_decided_by(model, found, at)}, "
            f"{needed} at precision {self.precision:.2f}"
        )

    def _rule_verdict(
        self, view: DeviceView, members: list[tuple[str, Workload, float | None]]
    ) -> RetentionVerdict:
        predictions = self._predict(view, [m[1] for m in members])
        named = {
            name: round(value, 4)
            for (name, _w, _f), value in zip(members, predictions, strict=True)
        }
        for (name, _w, floor), value in zip(members, predictions, strict=True):
            if floor is not None and value < floor:
                who = "the candidate" if name == "candidate" else f"lease {name}"
                return RetentionVerdict(
                    False,
                    named,
                    f"{who} would keep {value:.2f} of its "
                    f"solo speed, under its floor {floor:.2f} ({self.name})",
                )
        return RetentionVerdict(True, named, self.name)

    def lease_workload(self, lease: Lease) -> Workload:
        """A lease as the gate sees it: its solo signature, with its profile's counters at
        MPS shares (what the node's run records must carry too)."""
        return _workload(
            lease.lease_id,
            lease.profile,
            lease.thread_pct,
            lease.memory_bytes,
            self.profiles,
            lease.counters,
        )

    def lease_counters(self, lease: Lease) -> dict[str, float]:
        return solo_counters(lease.profile, lease.thread_pct, self.profiles, lease.counters)

    def estimate(self, view: DeviceView) -> dict[str, float]:
        """Each lease's estimated retention next to the others on its device, now."""
        if len(view.leases) < 2:
            return {lease.lease_id: 1.0 for lease in view.leases}
        workloads = [self.lease_workload(lease) for lease in view.leases]
        values = self._predict(view, workloads)
        return {lease.lease_id: round(v, 4) for lease, v in zip(view.leases, values, strict=True)}

    def estimate_live(self, view: DeviceView, measured: Mapping[str, float]) -> dict[str, float]:
        """Each lease's estimated retention from the device's live window counters: load
        the leases' signatures do not explain (measured busy above what they declare) joins
        the set as one more peer, ``unattributed``."""
        workloads = [self.lease_workload(lease) for lease in view.leases]
        extra = unattributed(workloads, measured)
        members = workloads + ([extra] if extra is not None else [])
        if len(members) < 2:
            return {lease.lease_id: 1.0 for lease in view.leases}
        values = self._predict(view, members)
        return {lease.lease_id: round(v, 4) for lease, v in zip(view.leases, values, strict=False)}

    def _predict(self, view: DeviceView, workloads: list[Workload]) -> list[float]:
        """Each workload's conservative retention (the rule's, without a model)."""
        if self.model is None:
            total = sum(w.counters.get("gpu_util", 0.0) for w in workloads)
            return [1.0 if total <= 100.0 else 100.0 / total] * len(workloads)
        device = view.device
        _mean, lower = self.model.predict_set(device.model, device.memory_bytes, workloads)
        return lower


UNATTRIBUTED_MIN = 0.02  # measured busy above the declared sum that counts as interference


def unattributed(workloads: list[Workload], measured: Mapping[str, float]) -> Workload | None:
    """The load a device shows beyond what its workloads' solo signatures add up to (capped
    at a full device), as a workload; None when the signatures explain what is measured."""
    declared = [busy_shares(w.counters, w.thread_pct) for w in workloads]
    sm_expected = min(1.0, sum(d[0] for d in declared))
    dram_expected = min(1.0, sum(d[1] for d in declared))
    sm_now, dram_now = busy_shares(measured)
    sm_extra = max(0.0, sm_now - sm_expected)
    dram_extra = max(0.0, dram_now - dram_expected)
    if sm_extra < UNATTRIBUTED_MIN and dram_extra < UNATTRIBUTED_MIN:
        return None
    counters = {
        "sm_active": sm_extra,
        "dram_active": dram_extra,
        "gpu_util": min(100.0, 110.0 * sm_extra),
        "mem_util": 100.0 * dram_extra,
    }
    return Workload("unattributed", 100.0 * sm_extra, 0, counters)


def _decided_by(model: RetentionModel, found: Estimates, at: int) -> str:
    """Which estimate the gate decided on, where not the one shown, and which pressure
    term weighs most in it."""
    if found.decided is None:
        return ""
    term = f", driven most by {found.term[at]}" if found.term else ""
    return f" on the {model.decides_on} estimate {float(found.decided[at]):.2f}{term}"
