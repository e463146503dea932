"""Every free-text field refuses control, separator and bidirectional-format characters,
naming the field; values repeated in messages are bounded."""

from __future__ import annotations

import pytest

from agent.api import validate
from agent.api.proto import agent_pb2 as pb
from agent.core.errors import ValidationError

HOSTILE = {
    "NUL": "\x00",
    "ESC": "\x1b[31m",
    "DEL": "\x7f",
    "C1 NEL": "\x85",
    "C1 CSI": "\x9b",
    "line separator": "\u2028",
    "paragraph separator": "\u2029",
    "LRE": "\u202a",
    "RLE": "\u202b",
    "PDF": "\u202c",
    "LRO": "\u202d",
    "RLO": "\u202e",
    "LRI": "\u2066",
    "RLI": "\u2067",
    "FSI": "\u2068",
    "PDI": "\u2069",
    "LRM": "\u200e",
    "RLM": "\u200f",
    "ALM": "\u061c",
}


def request(**fields: object) -> pb.Request:
    values: dict[str, object] = {
        "request_id": "r-1",
        "tenant": "team-a",
        "trust_domain": "team-a",
        "priority": pb.BURSTABLE,
        "memory_bytes": 2**30,
        "thread_pct": 10.0,
    }
    values.update(fields)
    return pb.Request(**values)  # type: ignore[arg-type]


def job_request(**job: object) -> pb.Request:
    return request(job=pb.Job(**job))  # type: ignore[arg-type]


def sizing_request(**sizing: object) -> pb.Request:
    values: dict[str, object] = {"parameters": 7_000_000_000, "mode": "inference", "layers": 32}
    values.update(sizing)
    return request(memory_bytes=0, sizing=pb.Sizing(**values))  # type: ignore[arg-type]


FIELDS = {
    "request.gpu_model": lambda v: request(gpu_model=f"H100{v}"),
    "request.tenant": lambda v: request(tenant=f"t{v}"),
    "request.trust_domain": lambda v: request(trust_domain=f"d{v}"),
    "request.request_id": lambda v: request(request_id=f"r{v}"),
    "request.profile": lambda v: request(profile=f"p{v}"),
    "request.job.job_type": lambda v: job_request(job_type=f"train{v}"),
    "request.job.model_type": lambda v: job_request(model_type=f"llm{v}"),
    "request.sizing.dtype": lambda v: sizing_request(dtype=f"bf16{v}"),
    "request.sizing.mode": lambda v: sizing_request(mode=f"inference{v}"),
}


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_request_fields_refuse_hostile_characters(field: str, name: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate.request(FIELDS[field](HOSTILE[name]))
    assert info.value.field == field


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize(
    "check",
    [
        lambda v: validate.text(f"drain {v}", "reason"),
        lambda v: validate.identifier(f"g{v}", "gang_id"),
        lambda v: validate.device_id(f"GPU-1{v}", "device_uuid"),
        lambda v: validate.counters({f"c{v}": 1.0}, "request.counters"),
    ],
    ids=["reason", "gang_id", "device_uuid", "counter name"],
)
def test_other_strings_refuse_hostile_characters(name: str, check: object) -> None:
    with pytest.raises(ValidationError):
        check(HOSTILE[name])  # type: ignore[operator]


@pytest.mark.parametrize(
    "value", ["H100 80GB HBM3", "A100-SXM4", "Tesla V100 (16 GB)", "日本語モデル", "café"]
)
def test_printable_text_including_non_ascii_letters_passes(value: str) -> None:
    assert validate.text(value, "request.gpu_model") == value


def test_the_refusal_names_the_character_and_never_echoes_it() -> None:
    with pytest.raises(ValidationError) as info:
        validate.text("ok\u202eevil", "request.gpu_model")
    message = str(info.value)
    assert "U+202E" in message and "position 2" in message
    assert "\u202e" not in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("short", "'short'"),
        ("x" * 64, repr("x" * 64)),
        ("y" * 65, repr("y" * 64 + "…")),
        ("z" * 3_000_000, repr("z" * 64 + "…")),
        ("a\nb", "'a\\nb'"),
    ],
)
def test_shown_values_are_bounded_and_escaped(value: str, expected: str) -> None:
    assert validate.shown(value) == expected


def test_a_huge_device_id_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValidationError) as info:
        validate.device_id("G" * 3_000_000)
    assert info.value.field == "device_uuid"
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    "value", ["", "GPU-11111111-2222-3333-4444-555555555555", "MIG-GPU-1111/1/0"]
)
def test_real_device_ids_pass(value: str) -> None:
    assert validate.device_id(value) == value
