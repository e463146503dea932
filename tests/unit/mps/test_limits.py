import pytest

from agent.core.errors import UnitError
from agent.core.types import Device
from agent.core.units import GIB
from agent.mps.limits import LEASE_MARKER_VAR, DaemonPaths, client_environment, daemon_environment

DEVICE = Device("GPU-abc", 3, "H100", 80 * GIB)
PATHS = DaemonPaths("/run/gpushare/mps", DEVICE.uuid)


def test_paths() -> None:
    assert PATHS.pipe_dir == "/run/gpushare/mps/GPU-abc/pipe"
    assert PATHS.log_dir == "/run/gpushare/mps/GPU-abc/log"


def test_client_environment_keys_the_limit_by_the_ordinal_the_client_sees() -> None:
    env = client_environment(
        DEVICE, PATHS, thread_pct=25, memory_bytes=10 * GIB + 5, lease_id="lease-1"
    )
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": PATHS.pipe_dir,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
        LEASE_MARKER_VAR: "lease-1",
    }
    assert "CUDA_VISIBLE_DEVICES" not in env


@pytest.mark.parametrize(("pct", "memory"), [(0, GIB), (101, GIB), (50, 1000)])
def test_client_environment_refuses_bad_limits(pct: float, memory: int) -> None:
    with pytest.raises(UnitError):
        client_environment(DEVICE, PATHS, thread_pct=pct, memory_bytes=memory, lease_id="x")


def test_daemon_environment_pins_the_daemon_to_its_device() -> None:
    assert daemon_environment(DEVICE, PATHS) == {
        "CUDA_MPS_PIPE_DIRECTORY": PATHS.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": PATHS.log_dir,
        "CUDA_VISIBLE_DEVICES": "GPU-abc",
    }
