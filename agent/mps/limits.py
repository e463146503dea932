"""What a lease's clients get: the environment that connects them to the device's MPS
daemon with their limits. Pure.

Which limit can a client exceed? Neither. A client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` can only *lower* what its server allows: when the
daemon's default or the server's setting is lower, that wins. So the agent enforces its
caps on the daemon side (defaults per device, ``set_active_thread_percentage`` /
``set_device_pinned_mem_limit`` per server) and hands each lease its own lower values
through the environment. Both apply per client *process*: two processes of one lease each
get the full amount, which is why the agent checks each lease's processes' memory
against its limit at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.types import Device
from agent.core.units import check_thread_percentage, mps_memory_limit

LEASE_MARKER_VAR = "GPUSHARE_LEASE_ID"


@dataclass(frozen=True, slots=True)
class DaemonPaths:
    """Where a device's MPS daemon keeps its sockets and logs: ``<root>/<uuid>/{pipe,log}``."""

    root: str
    device_uuid: str

    @property
    def base(self) -> str:
        return f"{self.root}/{self.device_uuid}"

    @property
    def pipe_dir(self) -> str:
        return f"{self.base}/pipe"

    @property
    def log_dir(self) -> str:
        return f"{self.base}/log"


# Each control daemon runs with CUDA_VISIBLE_DEVICES set to its one device, so the daemon,
# its server and every client of that server see that device as ordinal 0. Per-device limits
# ("by device index") therefore use ordinal 0, not the device's index on the node.
DAEMON_DEVICE_ORDINAL = 0


def client_environment(
    device: Device, paths: DaemonPaths, *, thread_pct: float, memory_bytes: int, lease_id: str
) -> dict[str, str]:
    """The variables a lease's MPS client needs.

    ``CUDA_VISIBLE_DEVICES`` is left out on purpose: an MPS client sees the devices of its
    server, and NVIDIA's guidance is not to set it in clients. The memory limit is keyed by
    the ordinal the client sees (:data:`DAEMON_DEVICE_ORDINAL`).
    """
    check_thread_percentage(thread_pct)
    return {
        "CUDA_MPS_PIPE_DIRECTORY": paths.pipe_dir,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": f"{thread_pct:g}",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": (
            f"{DAEMON_DEVICE_ORDINAL}={mps_memory_limit(memory_bytes)}"
        ),
        LEASE_MARKER_VAR: lease_id,
    }


def daemon_environment(device: Device, paths: DaemonPaths) -> dict[str, str]:
    """The variables the control daemon and every front-end call for this device run with."""
    return {
        "CUDA_MPS_PIPE_DIRECTORY": paths.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": paths.log_dir,
        "CUDA_VISIBLE_DEVICES": device.uuid,
    }
