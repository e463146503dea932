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
