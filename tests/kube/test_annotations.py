"""What a pod asks, read from its annotations: every rule, good and bad, by tables."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from agent.admission.sizing import Mode, SizingSpec
from agent.api import validate
from agent.core.errors import UnitError, ValidationError
from agent.core.podusers import FIX
from agent.core.types import PriorityClass
from agent.core.units import GIB, MIB
from agent.legacy.cluster import annotations as a
from agent.legacy.cluster import bounded
from agent.legacy.cluster.annotations import AnnotationError, parse_ask, parse_quantity, wants_share

NS = "team-a"
UID = "6f1c1b0e-4c1a-4a52-9f7e-3d2a1b0c9e8f"
SHARE = {"limits": {"gpushare.io/share": "1"}, "requests": {"gpushare.io/share": "1"}}
ASK = {"gpushare.io/memory": "20Gi", "gpushare.io/threads": "25"}
INFERENCE = (
    "{parameters: 7e9, mode: inference, layers: 32, kv_heads: 8, head_dim: 128,"
    " context_length: 4096}"
)
INFERENCE_BYTES = 7 * 10**9 * 2 + 2 * 32 * 8 * 128 * 2 * 4096  # bf16 weights + KV cache


def container(name: str = "main", resources: Any = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": "registry.example/train:1"}
    if resources is not None:
        body["resources"] = resources
    return {**body, **extra}


def pod(
    annotations: dict[str, str] | None = None,
    *,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    namespace: str | None = NS,
    uid: str | None = UID,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "train-42-0", "annotations": dict(annotations or {})}
    if namespace is not None:
        meta["namespace"] = namespace
    if uid is not None:
        meta["uid"] = uid
    spec: dict[str, Any] = {"containers": containers or [container(resources=SHARE)]}
    if init is not None:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def asks(**changes: str | None) -> dict[str, str]:
    """ASK with annotations set (a value) or removed (None); keys use _ for -."""
    merged: dict[str, str | None] = dict(ASK)
    for key, value in changes.items():
        merged[f"gpushare.io/{key.replace('_', '-')}"] = value
    return {k: v for k, v in merged.items() if v is not None}


# -- good ------------------------------------------------------------------------------

GOOD: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("defaults", pod(ASK), {
        "memory_bytes": 20 * GIB, "sizing": None, "thread_pct": 25.0,
        "priority": PriorityClass.BURSTABLE, "gang_id": "", "gang_size": 0,
        "tenant": NS, "trust_domain": NS, "request_id": UID, "shares": 1,
    }),
    ("memory Mi", pod(asks(memory="512Mi")), {"memory_bytes": 512 * MIB}),
    ("memory G is decimal", pod(asks(memory="20G")), {"memory_bytes": 20 * 10**9}),
    ("memory fraction", pod(asks(memory="1.5Gi")), {"memory_bytes": 3 * GIB // 2}),
    ("memory exponent", pod(asks(memory="4e9")), {"memory_bytes": 4 * 10**9}),
    ("memory agent GiB", pod(asks(memory="20GiB")), {"memory_bytes": 20 * GIB}),
    ("memory agent GB", pod(asks(memory="20GB")), {"memory_bytes": 20 * 10**9}),
    ("memory plain bytes", pod(asks(memory="1048576")), {"memory_bytes": MIB}),
    ("memory spaces", pod(asks(memory=" 8Gi ")), {"memory_bytes": 8 * GIB}),
    ("memory lowest", pod(asks(memory="1Mi")), {"memory_bytes": MIB}),
    ("memory highest", pod(asks(memory="1Pi")), {"memory_bytes": 2**50}),
    ("threads 100", pod(asks(threads="100")), {"thread_pct": 100.0}),
    ("threads fraction", pod(asks(threads="0.5")), {"thread_pct": 0.5}),
    ("guaranteed", pod(asks(priority="guaranteed")), {"priority": PriorityClass.GUARANTEED}),
    ("burstable", pod(asks(priority="burstable")), {"priority": PriorityClass.BURSTABLE}),
    ("best-effort", pod(asks(priority="best-effort")), {"priority": PriorityClass.BEST_EFFORT}),
    ("gang", pod(asks(gang="job-42", gang_size="4")), {"gang_id": "job-42", "gang_size": 4}),
    ("gang of one", pod(asks(gang="solo", gang_size="1")), {"gang_size": 1}),
    ("gang biggest", pod(asks(gang="g", gang_size="10000")), {"gang_size": 10_000}),
    ("gang longest", pod(asks(gang="g" * 121, gang_size="2")), {"gang_id": "g" * 121}),
    ("gang id chars", pod(asks(gang="a.b_c:d/e@f+g=h-1", gang_size="2")),
     {"gang_id": "a.b_c:d/e@f+g=h-1"}),
    ("sizing inference", pod(asks(memory=None, sizing=INFERENCE)), {
        "memory_bytes": INFERENCE_BYTES,
        "sizing": SizingSpec(7 * 10**9, Mode.INFERENCE, "bf16", 32, 8, 128, 4096, 1),
    }),
    ("sizing JSON training", pod(asks(memory=None, sizing='{"parameters": 1000000000, '
                                                         '"mode": "training"}')),
     {"memory_bytes": 16 * 10**9}),
    ("sizing fp8 two sequences", pod(asks(memory=None, sizing=INFERENCE.replace(
        "}", ", dtype: fp8, concurrent_sequences: 2}"))),
     {"memory_bytes": 7 * 10**9 + 2 * 32 * 8 * 128 * 4096 * 2}),
    ("sizing sequences 0 is 1", pod(asks(memory=None, sizing=INFERENCE.replace(
        "}", ", concurrent_sequences: 0}"))), {"memory_bytes": INFERENCE_BYTES}),
    ("share as int", pod(ASK, containers=[container(resources={"limits": {
        "gpushare.io/share": 1}})]), {"shares": 1}),
    ("share in requests only", pod(ASK, containers=[container(resources={"requests": {
        "gpushare.io/share": "1"}})]), {"shares": 1}),
    ("share in an init container", pod(ASK, containers=[container()],
                                      init=[container("setup", resources=SHARE)]), {"shares": 1}),
    ("share beside plain containers", pod(ASK, containers=[
        container("sidecar"), container(resources=SHARE)]), {"shares": 1}),
    ("no uid yet (webhook)", pod(ASK, uid=None), {"request_id": ""}),
    ("namespace is the trust domain", pod({
        **ASK, "gpushare.io/tenant": "other", "gpushare.io/trust-domain": "other",
        "gpushare.io/trust_domain": "other"}), {"tenant": NS, "trust_domain": NS}),
]  # fmt: skip


@pytest.mark.parametrize(("the_pod", "expected"), [g[1:] for g in GOOD], ids=[g[0] for g in GOOD])
def test_good_asks(the_pod: dict[str, Any], expected: dict[str, Any]) -> None:
    ask = parse_ask(the_pod)
    assert {name: getattr(ask, name) for name in expected} == expected


def test_an_ask_is_frozen() -> None:
    ask = parse_ask(pod(ASK))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ask.tenant = "other"  # type: ignore[misc]


# -- bad -------------------------------------------------------------------------------

M, S, T, P = (
    "gpushare.io/memory",
    "gpushare.io/sizing",
    "gpushare.io/threads",
    "gpushare.io/priority",
)
G, GS, R = "gpushare.io/gang", "gpushare.io/gang-size", "gpushare.io/share"
# YAML whose every level is nine aliases of the level below: 252 characters expand to
# 9**7 leaves (printing it cost seconds and hundreds of MiB)
BOMB = (  # two deep, so that the aliases are what is refused; a third level is the depth's
    "[&a [x,x,x,x,x,x,x,x,x], "
    + ", ".join(
        f"&{n} [" + ",".join([f"*{b}"] * 9) + "]" for b, n in zip("abcdef", "bcdefg", strict=True)
    )
    + "]"
)

BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("no memory, no sizing", pod(asks(memory=None)), M, "is required (or gpushare.io/sizing)"),
    ("memory and sizing", pod(asks(sizing=INFERENCE)), M, "not both"),
    ("memory words", pod(asks(memory="twenty gigs")), M, "cannot read"),
    ("memory lower-case gi", pod(asks(memory="20gi")), M, "cannot read"),
    ("memory space before unit", pod(asks(memory="20 Gi")), M, "cannot read"),
    ("memory milli", pod(asks(memory="512m")), M, "milli"),
    ("memory negative", pod(asks(memory="-1Gi")), M, "negative"),
    ("memory zero", pod(asks(memory="0")), M, "under 1 MiB"),
    ("memory under a MiB", pod(asks(memory="1023Ki")), M, "under 1 MiB"),
    ("memory over a PiB", pod(asks(memory="1025Ti")), M, "over 1 PiB"),
    ("memory huge exponent", pod(asks(memory="1e999")), M, "over 1 PiB"),
    ("memory bad agent unit", pod(asks(memory="20XiB")), M, "cannot read"),
    ("memory too long", pod(asks(memory="1" * 65)), M, "longer than 64"),
    ("memory not a string", pod({**ASK, M: 20}), M, "must be a string"),  # type: ignore[dict-item]
    ("threads missing", pod(asks(threads=None)), T, "is required"),
    ("threads words", pod(asks(threads="a quarter")), T, "must be a number in (0, 100]"),
    ("threads percent sign", pod(asks(threads="25%")), T, "must be a number in (0, 100]"),
    ("threads zero", pod(asks(threads="0")), T, "must be a number in (0, 100]"),
    ("threads negative", pod(asks(threads="-5")), T, "must be a number in (0, 100]"),
    ("threads over 100", pod(asks(threads="100.5")), T, "must be a number in (0, 100]"),
    ("threads nan", pod(asks(threads="nan")), T, "must be a number in (0, 100]"),
    ("threads inf", pod(asks(threads="inf")), T, "must be a number in (0, 100]"),
    ("threads overflow", pod(asks(threads="1e999")), T, "must be a number in (0, 100]"),
    ("priority unknown", pod(asks(priority="high")), P, "guaranteed, burstable or best-effort"),
    ("priority case", pod(asks(priority="Guaranteed")), P, "guaranteed, burstable or best-effort"),
    ("priority empty", pod(asks(priority="")), P, "guaranteed, burstable or best-effort"),
    ("priority underscore", pod(asks(priority="best_effort")), P, "best-effort"),
    ("gang without size", pod(asks(gang="job-42")), G, "without gpushare.io/gang-size"),
    ("size without gang", pod(asks(gang_size="4")), GS, "without gpushare.io/gang"),
    ("gang size zero", pod(asks(gang="g", gang_size="0")), GS, "from 1 to 10000"),
    ("gang size fraction", pod(asks(gang="g", gang_size="1.5")), GS, "from 1 to 10000"),
    ("gang size words", pod(asks(gang="g", gang_size="four")), GS, "from 1 to 10000"),
    ("gang size negative", pod(asks(gang="g", gang_size="-4")), GS, "from 1 to 10000"),
    ("gang size too big", pod(asks(gang="g", gang_size="10001")), GS, "from 1 to 10000"),
    ("gang size empty", pod(asks(gang="g", gang_size="")), GS, "from 1 to 10000"),
    ("gang space", pod(asks(gang="job 42", gang_size="4")), G, "letters, digits and ._:/@+=-"),
    ("gang hash", pod(asks(gang="job#42", gang_size="4")), G, "letters, digits and ._:/@+=-"),
    ("gang newline", pod(asks(gang="job\n42", gang_size="4")), G, "letters, digits"),
    ("gang unicode", pod(asks(gang="j\u00f6b", gang_size="4")), G, "letters, digits"),
    ("gang empty", pod(asks(gang="", gang_size="4")), G, "is empty"),
    ("gang too long", pod(asks(gang="g" * 129, gang_size="4")), G, "longer than 128"),
    ("gang with namespace too long", pod(asks(gang="g" * 65, gang_size="4"),
                                         namespace="n" * 63), G, "must fit 128"),
    ("sizing not YAML", pod(asks(memory=None, sizing="{parameters: [")), S, "not YAML or JSON"),
    ("sizing a number", pod(asks(memory=None, sizing="7e9")), S, "must be an object"),
    ("sizing a list", pod(asks(memory=None, sizing="[7e9, inference]")), S, "must be an object"),
    ("sizing no parameters", pod(asks(memory=None, sizing="{mode: training}")), S,
     "parameters is required"),
    ("sizing no mode", pod(asks(memory=None, sizing="{parameters: 7e9}")), S, "mode is required"),
    ("sizing unknown field", pod(asks(memory=None, sizing="{parameters: 1, mode: training, "
                                                          "params: 2}")), S, "unknown field"),
    ("sizing bad mode", pod(asks(memory=None, sizing="{parameters: 7e9, mode: serving}")), S,
     "mode must be training or inference"),
    ("sizing negative", pod(asks(memory=None, sizing="{parameters: -1, mode: training}")), S,
     "parameters must be a whole number"),
    ("sizing words", pod(asks(memory=None, sizing="{parameters: lots, mode: training}")), S,
     "parameters must be a whole number"),
    ("sizing fraction", pod(asks(memory=None, sizing="{parameters: 1.5, mode: training}")), S,
     "parameters must be a whole number"),
    ("sizing bool", pod(asks(memory=None, sizing="{parameters: true, mode: training}")), S,
     "parameters must be a whole number"),
    ("sizing layers too big", pod(asks(memory=None, sizing=INFERENCE.replace(
        "layers: 32", "layers: 5000000000"))), S, "layers must be a whole number"),
    ("sizing zero parameters", pod(asks(memory=None, sizing="{parameters: 0, mode: training}")),
     S, "parameters must be a positive number"),
    ("sizing inference without layers", pod(asks(memory=None, sizing=INFERENCE.replace(
        "layers: 32, ", ""))), S, "layers must be positive"),
    ("sizing bad dtype", pod(asks(memory=None, sizing=INFERENCE.replace(
        "}", ", dtype: fp64}"))), S, "dtype must be one of"),
    ("sizing dtype not a string", pod(asks(memory=None, sizing=INFERENCE.replace(
        "}", ", dtype: 16}"))), S, "dtype must be a string"),
    ("sizing over a PiB", pod(asks(memory=None, sizing="{parameters: 1e14, mode: training}")), S,
     "over 1 PiB"),
    ("sizing under a MiB", pod(asks(memory=None, sizing="{parameters: 1000, mode: training}")),
     S, "under 1 MiB"),
    ("sizing too long", pod(asks(memory=None, sizing="{" + " " * 1100 + "}")), S,
     "longer than 1024"),
    ("no share requested", pod(ASK, containers=[container()]), R, "no container requests it"),
    ("share zero", pod(ASK, containers=[container(resources={"limits": {R: "0"}})]), R,
     "no container requests it"),
    ("two shares in one container", pod(ASK, containers=[container(resources={"limits": {
        R: "2"}})]), R, "requests 2 in all; a pod gets one lease"),
    ("two containers", pod(ASK, containers=[container("a", resources=SHARE),
                                            container("b", resources=SHARE)]), R, "requests 2"),
    ("init and app", pod(ASK, init=[container("setup", resources=SHARE)]), R, "requests 2"),
    ("share milli", pod(ASK, containers=[container(resources={"limits": {R: "500m"}})]), R,
     "spec.containers[0] asks for '500m': must be a whole number"),
    ("share negative", pod(ASK, containers=[container(resources={"limits": {R: -1}})]), R,
     "must be a whole number"),
    ("no namespace", pod(ASK, namespace=None), "metadata.namespace", "is required"),
    # Kubernetes quantities and numbers are ASCII: Python's int, float and Decimal read
    # other scripts' digits too
    ("memory Arabic-Indic digits", pod(asks(memory="\u0662\u0660Gi")), M, "cannot read"),
    ("memory full-width digits", pod(asks(memory="\uff12\uff10Gi")), M, "cannot read"),
    ("memory Devanagari digits", pod(asks(memory="\u0968\u0966Gi")), M, "cannot read"),
    ("memory agent spelling in full-width", pod(asks(memory="\uff12\uff10GiB")), M, "cannot read"),
    ("memory full-width exponent", pod(asks(memory="4e\uff19")), M, "cannot read"),
    ("memory Unicode space", pod(asks(memory="\u20038Gi")), M, "cannot read"),
    ("threads full-width", pod(asks(threads="\uff12\uff15")), T, "must be a number in (0, 100]"),
    ("threads Arabic-Indic", pod(asks(threads="\u0662\u0665")), T, "must be a number in"),
    ("sizing full-width count", pod(asks(memory=None, sizing="{parameters: '\uff17e9', "
                                                          "mode: training}")), S,
     "parameters must be a whole number"),
    ("sizing Arabic-Indic count", pod(asks(memory=None, sizing=INFERENCE.replace(
        "layers: 32", "layers: '\u0663\u0662'"))), S, "layers must be a whole number"),
    # YAML: no aliases, no anchors, a flat object (size, depth and nodes bounded first)
    ("sizing alias", pod(asks(memory=None, sizing="{mode: &m training, parameters: 7e9, "
                                                  "dtype: *m}")), S, "anchors"),
    ("sizing alias bomb", pod(asks(memory=None, sizing=BOMB)), S, "aliases"),
    ("sizing alias bomb in an object", pod(asks(memory=None, sizing="{mode: training, "
                                                                   f"parameters: {BOMB}}}")), S,
     "nested deeper than"),
    ("sizing anchor alone", pod(asks(memory=None, sizing="{mode: &m training, "
                                                         "parameters: 7e9}")), S, "anchors"),
    ("sizing nested 500 deep", pod(asks(memory=None, sizing="[" * 500 + "]" * 500)), S,
     "nested deeper than"),
    ("sizing nested value", pod(asks(memory=None, sizing="{parameters: [[[[1]]]], "
                                                        "mode: training}")), S,
     "nested deeper than"),
    ("sizing too many nodes", pod(asks(memory=None, sizing="[" + "1," * 300 + "1]")), S,
     "more than"),
    ("sizing bad int tag", pod(asks(memory=None, sizing="{parameters: !!int x7, "
                                                        "mode: training}")), S, "a tag"),
    ("sizing empty int tag", pod(asks(memory=None, sizing="!!int")), S, "a tag"),
    ("sizing empty bool tag", pod(asks(memory=None, sizing="{mode: !!bool }")), S, "a tag"),
    ("sizing empty timestamp tag", pod(asks(memory=None, sizing="!!timestamp")), S, "a tag"),
    ("sizing good int tag", pod(asks(memory=None, sizing="{parameters: !!int 7000000000, "
                                                         "mode: training}")), S, "a tag"),
    ("sizing local tag", pod(asks(memory=None, sizing="!sizing {parameters: 7e9, "
                                                      "mode: training}")), S, "a tag"),
    ("sizing bad date", pod(asks(memory=None, sizing="{parameters: 1, mode: 2024-13-45}")), S,
     "is not YAML or JSON"),
    ("sizing bad hexadecimal", pod(asks(memory=None, sizing="{parameters: 0x_, "
                                                            "mode: training}")), S,
     "is not YAML or JSON"),
    ("sizing control character", pod(asks(memory=None, sizing="\x1f")), S,
     "is not YAML or JSON"),
    ("sizing two documents", pod(asks(memory=None, sizing="{parameters: 1}\n---\n{}")), S,
     "is not YAML or JSON"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("the_pod", "field", "reason"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_asks(the_pod: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        parse_ask(the_pod)
    assert caught.value.field == field
    assert reason in caught.value.reason
    assert str(caught.value) == f"{field}: {caught.value.reason}"
    assert isinstance(caught.value, ValidationError)


# -- quantities ------------------------------------------------------------------------

QUANTITIES = [
    ("1", 1), ("1Ki", 1024), ("1k", 1000), ("1M", 10**6), ("2Ti", 2 * 2**40), ("1T", 10**12),
    ("1P", 10**15), ("1Ei", 2**60), ("1E", 10**18), ("1E3", 1000), ("1e3", 1000),
    ("25e-1", 2), (".5Gi", GIB // 2), ("5.Gi", 5 * GIB), ("+3Mi", 3 * MIB),
    ("0.3", 0), ("1.9", 1), ("512MiB", 512 * MIB), ("1 GiB", GIB), ("100b", 100),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), QUANTITIES, ids=[q[0] for q in QUANTITIES])
def test_quantities(text: str, expected: int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "Gi", "1Gi5", "1gi", "1 Gi", "1m", "-1", "1e", "--1", "1iB", "2e1Ki",
     "\u0662\u0660Gi", "\uff12\uff15", "\u0968Mi", "1e\u0663", "\uff11GiB", "1\u00a0GiB",
     "\u20038Gi", "8Gi\u3000", "\u00b2", "1_000", "0x10", "1" * 65, " " * 60 + "1Gi" + " " * 60,
     "20Gi\n", "20GiB\n", "100b\n", "20GiB\r\n"],
)  # fmt: skip
def test_not_quantities(text: str) -> None:
    with pytest.raises(UnitError) as caught:
        parse_quantity(text)
    assert len(str(caught.value)) < 120  # the value is cut, never repeated in full


LONG_NUMBERS: list[tuple[str, dict[str, Any]]] = [
    ("memory 1e999", pod(asks(memory="1e999"))),
    ("memory 64 nines", pod(asks(memory="9" * 64))),
    ("memory 60 nines in Ei", pod(asks(memory="9" * 62 + "Ei"))),
    ("threads 64 nines", pod(asks(threads="9" * 64))),
    ("gang size 64 nines", pod(asks(gang="g", gang_size="9" * 64))),
    ("share of 10**999 units", pod(ASK, containers=[container(resources={"limits": {
        R: 10**999}})])),
    ("sizing 1000 digits", pod(asks(memory=None, sizing="{mode: training, parameters: "
                                                        + "9" * 990 + "}"))),
    ("sizing sized to 10**40 bytes", pod(asks(memory=None, sizing="{mode: inference, "
        "parameters: 1, layers: 4294967295, kv_heads: 4294967295, head_dim: 4294967295, "
        "context_length: 4294967295, concurrent_sequences: 4294967295}"))),
]  # fmt: skip


@pytest.mark.parametrize("the_pod", [n[1] for n in LONG_NUMBERS], ids=[n[0] for n in LONG_NUMBERS])
def test_long_numbers_are_not_echoed(the_pod: dict[str, Any]) -> None:
    """A refusal names the value it refuses, cut: a caller's 1000-digit number is not
    repeated back to it (nor into a log line) in full."""
    with pytest.raises(AnnotationError) as caught:
        parse_ask(the_pod)
    message = str(caught.value)
    assert not re.search(r"[0-9]{41}", message), message
    assert len(message) < 300, message


def test_shown_cuts_and_escapes_any_value() -> None:
    nested: Any = ["x"] * 9
    for _ in range(6):
        nested = [nested] * 9  # 9**7 leaves, 7 objects: printed in full, megabytes
    for value in (nested, "a\nb\x1b[31m" * 100, 10**999, -(10**4000), {"k" * 100: ["v"] * 100}):
        text = bounded.shown(value)
        assert len(text) <= 10 * bounded.MAX_SHOWN, text  # 40 characters, each escaped at most
        assert text.isprintable(), text


# -- who wants a share -----------------------------------------------------------------

WANTS = [
    ("plain pod", pod(containers=[container()]), False),
    ("another resource", pod(containers=[container(resources={"limits": {
        "nvidia.com/gpu": "1"}})]), False),
    ("only the lease annotation", pod({"gpushare.io/lease": "l-1"},
                                      containers=[container()]), False),
    ("only the node-agent annotation", pod({"gpushare.io/node-agent": "n:1"},
                                           containers=[container()]), False),
    ("another gpushare annotation", pod({"gpushare.io/comment": "x"},
                                        containers=[container()]), False),
    ("share in limits", pod(containers=[container(resources={"limits": {R: "1"}})]), True),
    ("share in requests", pod(containers=[container(resources={"requests": {R: "1"}})]), True),
    ("share in init container", pod(containers=[container()], init=[container(
        resources=SHARE)]), True),
    ("share of zero still names it", pod(containers=[container(resources={"limits": {
        R: "0"}})]), True),
    *[(f"only {name}", pod({name: "x"}, containers=[container()]), True)
      for name in a.REQUEST_ANNOTATIONS],
    ("no spec at all", {"metadata": {"name": "x"}}, False),
    ("empty", {}, False),
]  # fmt: skip


@pytest.mark.parametrize(("the_pod", "expected"), [w[1:] for w in WANTS], ids=[w[0] for w in WANTS])
def test_wants_share(the_pod: dict[str, Any], expected: bool) -> None:
    assert wants_share(the_pod) is expected


# -- the names and the agent's own rules -----------------------------------------------


def test_names() -> None:
    assert (a.MEMORY_ANNOTATION, a.SIZING_ANNOTATION, a.THREADS_ANNOTATION) == (M, S, T)
    assert (a.PRIORITY_ANNOTATION, a.GANG_ANNOTATION, a.GANG_SIZE_ANNOTATION) == (P, G, GS)
    assert a.LEASE_ANNOTATION == "gpushare.io/lease"
    assert a.NODE_AGENT_ANNOTATION == "gpushare.io/node-agent"
    assert a.FINALIZER == "gpushare.io/lease"
    assert a.RESOURCE == R
    assert a.SCHEDULER_NAME == "gpushare"
    assert set(a.REQUEST_ANNOTATIONS).isdisjoint(a.CLUSTER_ANNOTATIONS)


def test_bounds_are_the_agents() -> None:
    assert a.MIN_MEMORY_BYTES == validate.MIN_MEMORY_BYTES
    assert a.MAX_MEMORY_BYTES == validate.MAX_MEMORY_BYTES
    assert a.MAX_IDENTIFIER == validate.MAX_TEXT


@pytest.mark.parametrize(
    "value",
    ["job-42", "a.b_c:d/e@f+g=h", "x" * 128, "x" * 129, "job 42", "job#42", "", "jöb", "a\tb",
     "a\u202eb", "semi;colon", "back\\slash"],
)  # fmt: skip
def test_identifier_rule_is_the_agents(value: str) -> None:
    def accepted(check: Any) -> bool:
        try:
            check(value, "gang")
        except ValidationError:
            return False
        return True

    assert accepted(a.identifier) == accepted(validate.identifier)


# -- the share's user --------------------------------------------------------------------


def as_user(uid: object, name: str = "main", resources: Any = SHARE) -> dict[str, Any]:
    """A container that runs as ``uid`` (None: it does not say)."""
    context = {} if uid is None else {"securityContext": {"runAsUser": uid}}
    return container(name, resources=resources, **context)


def pod_as(uid: object, **parts: Any) -> dict[str, Any]:
    """A share pod whose ``spec.securityContext.runAsUser`` is ``uid`` (None: unset)."""
    the_pod = pod(ASK, **parts)
    if uid is not None:
        the_pod["spec"]["securityContext"] = {"runAsUser": uid}
    return the_pod


ZERO = {"limits": {R: "0"}}  # a container that names the share with no unit: it uses it
PLAIN = {"limits": {"cpu": "1"}}
AS_ANNOTATED = pod(ASK, containers=[as_user(1000, "a", PLAIN), as_user(None, "b", PLAIN)])

# the pod -> (its share's UIDs, the share's containers that do not say, the one UID)
USERS: list[tuple[str, dict[str, Any], set[int], tuple[str, ...], int | None]] = [
    ("the pod's", pod_as(1000), {1000}, (), 1000),
    ("root", pod_as(0), {0}, (), 0),
    ("nobody says", pod_as(None), set(), ("main",), None),
    ("the container's", pod_as(None, containers=[as_user(1000)]), {1000}, (), 1000),
    ("the container's over the pod's", pod_as(1000, containers=[as_user(2000)]), {2000}, (),
     2000),
    ("a sidecar without a share does not count", pod_as(None, containers=[
        as_user(1000), as_user(None, "sidecar", PLAIN), as_user(5, "other", PLAIN)]), {1000},
     (), 1000),
    ("a share of 0 units counts", pod_as(None, containers=[
        as_user(1000), as_user(2000, "aux", ZERO)]), {1000, 2000}, (), None),
    ("an init container's share", pod_as(None, containers=[as_user(7, "app", PLAIN)],
                                         init=[as_user(None, "setup")]), set(), ("setup",),
     None),
    ("annotations only: every container", AS_ANNOTATED, {1000}, ("b",), None),
    ("-1 is not a UID", pod_as(-1), set(), ("main",), None),
    ("4294967295 is not a UID", pod_as(2**32 - 1), set(), ("main",), None),
    ("a string is not a UID", pod_as("1000"), set(), ("main",), None),
    ("true is not a UID", pod_as(True), set(), ("main",), None),
    ("an unreadable container's hides the pod's", pod_as(1000, containers=[as_user(1.5)]),
     set(), ("main",), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("the_pod", "uids", "unstated", "uid"), [u[1:] for u in USERS], ids=[u[0] for u in USERS]
)
def test_the_share_s_users(
    the_pod: dict[str, Any], uids: set[int], unstated: tuple[str, ...], uid: int | None
) -> None:
    users = a.share_users(the_pod)
    assert (set(users.uids), users.unstated, users.uid) == (uids, unstated, uid)
    if the_pod is not AS_ANNOTATED:  # parse_ask refuses a pod without a share request
        assert parse_ask(the_pod).run_as_uid == uid


# the pod -> the field refused and the start of the reason (None: it passes)
ONE_USER: list[tuple[str, dict[str, Any], str | None, str]] = [
    ("the pod's", pod_as(1000), None, ""),
    ("the container's", pod_as(None, containers=[as_user(1000)]), None, ""),
    ("nobody says", pod_as(None), "spec.containers[0].securityContext.runAsUser",
     "the GPU share's user is not stated: set securityContext.runAsUser on the pod"),
    ("the second share container does not say", pod_as(None, containers=[
        as_user(1000), as_user(None, "aux", ZERO)]),
     "spec.containers[1].securityContext.runAsUser", "the GPU share's user is not stated"),
    ("two UIDs", pod_as(None, containers=[as_user(1000), as_user(2000, "aux", ZERO)]),
     "spec.containers[1].securityContext.runAsUser",
     "is 2000, but spec.containers[0] runs as 1000: a share has one user; set"),
    ("an init container's share", pod_as(None, containers=[as_user(7, "app", PLAIN)],
                                         init=[as_user(None, "setup")]),
     "spec.initContainers[0].securityContext.runAsUser", "the GPU share's user is not stated"),
    ("annotations only: every container", AS_ANNOTATED,
     "spec.containers[1].securityContext.runAsUser", "the GPU share's user is not stated"),
    ("a UID over the range", pod_as(2**32 - 1), "spec.containers[0].securityContext.runAsUser",
     "the GPU share's user is not stated"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("the_pod", "field", "reason"), [o[1:] for o in ONE_USER], ids=[o[0] for o in ONE_USER]
)
def test_a_share_has_one_stated_user(
    the_pod: dict[str, Any], field: str | None, reason: str
) -> None:
    if field is None:
        a.check_one_user(the_pod)
        return
    with pytest.raises(AnnotationError) as caught:
        a.check_one_user(the_pod)
    assert (caught.value.field, caught.value.reason[: len(reason)]) == (field, reason)
    assert caught.value.reason.endswith(FIX)
    if the_pod is not AS_ANNOTATED:
        parse_ask(the_pod)  # read without the requirement
        with pytest.raises(AnnotationError, match=re.escape(field)):
            parse_ask(the_pod, require_user=True)
