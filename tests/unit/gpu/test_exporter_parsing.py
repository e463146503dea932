"""dcgm-exporter text, from the real samples, mapped onto devices."""

from pathlib import Path

import pytest

from agent.core.errors import TelemetryError
from agent.core.types import Device
from agent.core.units import GIB, MIB
from agent.gpu.exporter import parse_exposition, samples_from

DATA = Path(__file__).parents[2] / "data" / "telemetry"


def body(name: str) -> str:
    return (DATA / f"exporter-{name}.txt").read_text()


def gpu(uuid: str, index: int = 0) -> Device:
    return Device(uuid, index, "GPU", 16 * GIB)


def test_old_style_sample_with_spaces_and_a_blank_sentinel() -> None:
    device = gpu("GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52")
    for name in ("A", "B"):
        (sample,) = samples_from(parse_exposition(body(name)), [device], taken_at=5.0)
        assert sample.counters == {"sm_clock_mhz": 139.0, "mem_clock_mhz": 405.0}, (
            "the NOT_SUPPORTED memory temperature must be dropped"
        )
        assert sample.taken_at == 5.0


def test_two_gpus_of_a_kubernetes_node_with_the_hostname_label() -> None:
    first = gpu("GPU-55274b56-9033-f166-7723-77088b0ff94d", 0)
    second = gpu("GPU-dad58a68-8239-6bb7-1f07-539b85fabfee", 1)
    samples = samples_from(parse_exposition(body("F")), [first, second], taken_at=0.0)
    assert [(s.device_uuid, s.counters["sm_clock_mhz"]) for s in samples] == [
        (first.uuid, 135.0),
        (second.uuid, 135.0),
    ]


def test_units_are_converted_to_canonical() -> None:
    device = gpu("GPU-7ad09335-aadb-19c3-e3a8")
    (sample,) = samples_from(parse_exposition(body("G")), [device], taken_at=0.0)
    assert sample.counters == {"gpu_util": 0.0, "fb_used_bytes": 21383.0 * MIB}


@pytest.mark.parametrize("name", ["C", "D"])
def test_unknown_metrics_are_ignored_whatever_the_hostname_spelling(name: str) -> None:
    device = gpu("GPU-00000000-0000-0000-0000-000000000000")
    assert samples_from(parse_exposition(body(name)), [device], taken_at=0.0) == []


def test_unknown_gpu_labels_give_no_sample() -> None:
    stranger = gpu("GPU-ffffffff-ffff-ffff-ffff-ffffffffffff")
    assert samples_from(parse_exposition(body("F")), [stranger], taken_at=0.0) == []


def test_mig_instances_are_matched_by_parent_uuid_and_gpu_instance_id() -> None:
    parent = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
    first = Device("MIG-1", 0, "A100", 40 * GIB, parent_uuid=parent, gpu_instance_id=1)
    second = Device("MIG-2", 0, "A100", 40 * GIB, parent_uuid=parent, gpu_instance_id=2)
    samples = {
        s.device_uuid: s.counters
        for s in samples_from(parse_exposition(body("mig")), [first, second], taken_at=0)
    }
    assert samples["MIG-1"] == {"gr_engine_active": 0.625, "fb_used_bytes": 1024.0 * MIB}
    assert samples["MIG-2"] == {"gr_engine_active": 0.125}, "blank memory value dropped"
    whole = gpu(parent)
    (sample,) = samples_from(parse_exposition(body("mig")), [whole], taken_at=0)
    assert sample.counters == {"power_w": 212.5}, "instance series never land on the GPU"


@pytest.mark.parametrize(
    "text",
    [
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x" 5\n',  # truncated mid-labels
        'TEST_METRIC{gpu="0",test-uuid="GPU-x"} 42\n',  # invalid label name
        "DCGM_FI_DEV_GPU_UTIL{} not-a-number\n",
    ],
)
def test_unreadable_bodies_raise_telemetry_errors(text: str) -> None:
    with pytest.raises(TelemetryError):
        parse_exposition(text)
