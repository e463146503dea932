import os
import stat

import pynvml
import pytest

from agent.core.errors import GpuError, GpuUnavailableError
from agent.gpu.nvml import NvmlGpuBackend, translate
from tests.conftest import nvml_unavailable_reason

CASES = [
    # (NVML code, agent error class, words the message must carry)
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, GpuUnavailableError, "libnvidia-ml.so.1"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, GpuUnavailableError, "kernel driver is not loaded"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, GpuUnavailableError, "different versions"),
    (pynvml.NVML_ERROR_GPU_IS_LOST, GpuError, "NVML error 15"),
]


@pytest.mark.parametrize(("code", "cls", "words"), CASES)
def test_translation(code: int, cls: type[GpuError], words: str) -> None:
    error = translate(pynvml.NVMLError(code), "initialise NVML")
    assert type(error) is cls
    assert words in str(error)
    if cls is GpuUnavailableError:
        assert "gpushare serve --sim" in str(error)


async def test_start_without_a_driver_says_what_is_missing() -> None:
    if nvml_unavailable_reason() is None:
        pytest.skip("this machine has a working NVML")
    backend = NvmlGpuBackend()
    with pytest.raises(GpuUnavailableError, match="--sim") as info:
        await backend.start()
    assert isinstance(info.value.__cause__, pynvml.NVMLError), "the NVML error is chained"
    await backend.aclose()  # nothing to shut down; must not raise


@pytest.mark.gpu
async def test_real_inventory_lists_devices() -> None:
    backend = NvmlGpuBackend()
    await backend.start()
    try:
        devices = await backend.list_devices()
    finally:
        await backend.aclose()
    assert devices
    assert all(d.uuid.startswith(("GPU-", "MIG-")) and d.memory_bytes > 0 for d in devices)


class FakeMemory:
    def __init__(self, total: int) -> None:
        self.total = total


def nvml_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML as pynvml answers on a node of two GPUs whose minor numbers run the other way
    from their indexes (as the driver numbered them at probe), the second in MIG mode with
    two instances (GPU instances 1 and 2, compute instance 0 each). Handles are names."""
    gpus = {"gpu0": ("GPU-aaaa", 1, False), "gpu1": ("GPU-bbbb", 0, True)}
    migs = {"mig0": ("MIG-cccc", 1, 0), "mig1": ("MIG-dddd", 2, 0)}
    answers = {
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: f"gpu{i}",
        "nvmlDeviceGetMemoryInfo": lambda h: FakeMemory(80 * 2**30 if h in gpus else 40 * 2**30),
        "nvmlDeviceGetCudaComputeCapability": lambda h: (9, 0),
        "nvmlDeviceGetUUID": lambda h: gpus[h][0] if h in gpus else migs[h][0],
        "nvmlDeviceGetName": lambda h: (
            "NVIDIA H100 80GB HBM3" + (" MIG 3g.40gb" if h in migs else "")
        ),
        "nvmlDeviceGetMinorNumber": lambda h: gpus[h][1],
        "nvmlDeviceGetMigMode": lambda h: [int(gpus[h][2]), int(gpus[h][2])],
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": lambda h, slot: _mig_slot(slot),
        "nvmlDeviceGetGpuInstanceId": lambda h: migs[h][1],
        "nvmlDeviceGetComputeInstanceId": lambda h: migs[h][2],
    }
    for name, answer in answers.items():
        monkeypatch.setattr(pynvml, name, answer)


def _mig_slot(slot: int) -> str:
    if slot >= 2:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)  # an empty slot
    return f"mig{slot}"


def test_devices_carry_their_minor_numbers_and_mig_instance_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml_answers(monkeypatch)
    devices = NvmlGpuBackend()._list_devices()
    by_uuid = {d.uuid: d for d in devices}
    assert sorted(by_uuid) == ["GPU-aaaa", "MIG-cccc", "MIG-dddd"]
    assert (by_uuid["GPU-aaaa"].index, by_uuid["GPU-aaaa"].minor) == (0, 1)
    first, second = by_uuid["MIG-cccc"], by_uuid["MIG-dddd"]
    assert (first.index, first.minor, first.parent_uuid) == (1, 0, "GPU-bbbb"), "the parent's"
    assert (first.gpu_instance_id, first.compute_instance_id) == (1, 0)
    assert (second.gpu_instance_id, second.compute_instance_id) == (2, 0)


def test_a_gpu_without_a_minor_number_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml_answers(monkeypatch)

    def not_supported(handle: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMinorNumber", not_supported)
    assert {d.minor for d in NvmlGpuBackend()._list_devices()} == {None}


@pytest.mark.gpu
async def test_real_devices_nodes_are_by_minor_number() -> None:
    """On a real node: each GPU's /dev/nvidia<minor> is the NVIDIA character device (major
    195) with that minor number."""
    backend = NvmlGpuBackend()
    await backend.start()
    try:
        devices = await backend.list_devices()
    finally:
        await backend.aclose()
    for device in devices:
        assert device.minor is not None, device
        found = os.stat(f"/dev/nvidia{device.minor}")
        assert stat.S_ISCHR(found.st_mode)
        assert (os.major(found.st_rdev), os.minor(found.st_rdev)) == (195, device.minor)
