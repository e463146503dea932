import pytest

from agent.admission.sizing import Mode, SizingSpec, size
from agent.core.errors import ValidationError

GB = 10**9

CASES = [
    (
        "7B mixed-precision Adam training: 16 bytes per parameter",
        SizingSpec(7 * GB, Mode.TRAINING),
        112 * GB,
    ),
    # Llama-2-7B-like in bf16: 32 layers, 32 KV heads of 128 dims; 4096 tokens x 4 sequences
    (
        "7B inference, bf16, 4 x 4096 tokens",
        SizingSpec(7 * GB, Mode.INFERENCE, "bf16", 32, 32, 128, 4096, 4),
        14 * GB + 2 * 32 * 32 * 128 * 2 * 4096 * 4,
    ),
    # grouped-query attention: 8 KV heads
    (
        "70B inference with GQA, fp8 weights and cache, one 8192-token sequence",
        SizingSpec(70 * GB, Mode.INFERENCE, "fp8", 80, 8, 128, 8192, 1),
        70 * GB + 2 * 80 * 8 * 128 * 1 * 8192,
    ),
]


@pytest.mark.parametrize(("description", "spec", "total"), CASES)
def test_sizing(description: str, spec: SizingSpec, total: int) -> None:
    assert size(spec).total_bytes == total, description


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (SizingSpec(0, Mode.TRAINING), "parameters"),
        (SizingSpec(GB, Mode.INFERENCE, "fp64", 1, 1, 1, 1, 1), "dtype"),
        (SizingSpec(GB, Mode.INFERENCE, "bf16", 0, 8, 128, 10, 1), "layers"),
        (SizingSpec(GB, Mode.INFERENCE, "bf16", 8, 8, 128, 0, 1), "context_length"),
    ],
)
def test_bad_specs_name_the_field(spec: SizingSpec, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        size(spec)
    assert info.value.field == field
