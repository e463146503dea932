"""Canonical counter names and units, and how each source's fields map onto them. Pure.

Every source (DCGM, dcgm-exporter, NVML, the simulated node) produces samples keyed by these
names, in these units, so that windows, the estimator and the on-call view never care where
a number came from. See docs/telemetry.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

MIB = 1024 * 1024

# name -> (unit, meaning)
CANONICAL: Mapping[str, tuple[str, str]] = {
    "gr_engine_active": ("ratio 0..1", "time a graphics/compute context was busy"),
    "sm_active": ("ratio 0..1", "cycles an SM had at least one warp assigned"),
    "sm_occupancy": ("ratio 0..1", "resident warps / theoretical maximum"),
    "tensor_active": ("ratio 0..1", "cycles any tensor pipe was active"),
    "dram_active": ("ratio 0..1", "cycles the memory interface was busy"),
    "fp64_active": ("ratio 0..1", "cycles the FP64 pipe was active"),
    "fp32_active": ("ratio 0..1", "cycles the FP32 pipe was active"),
    "fp16_active": ("ratio 0..1", "cycles the FP16 pipe was active"),
    "pcie_tx_bytes_per_s": ("bytes/s", "PCIe transmit rate, device to host"),
    "pcie_rx_bytes_per_s": ("bytes/s", "PCIe receive rate, host to device"),
    "gpu_util": ("percent 0..100", "time a kernel was running (coarse)"),
    "mem_util": ("percent 0..100", "time device memory was read or written"),
    "fb_used_bytes": ("bytes", "device memory in use"),
    "fb_free_bytes": ("bytes", "device memory free"),
    "power_w": ("watts", "board power draw"),
    "sm_clock_mhz": ("MHz", "SM clock"),
    "mem_clock_mhz": ("MHz", "memory clock"),
    "temperature_c": ("degrees C", "GPU temperature"),
    "clocks_event_reasons": ("bitmask", "why clocks are held down (throttling)"),
    "xid_last": ("Xid number", "the last Xid error reported (DCGM)"),
}

DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0  # values at or above this are "no data" sentinels
DCGM_FP64_BLANK = 140737488355328.0


def is_blank(value: float) -> bool:
    """DCGM's not-found / not-supported / not-permitted sentinels are not data."""
    return value >= DCGM_INT64_BLANK or DCGM_FP64_BLANK <= value < DCGM_FP64_BLANK + 16


def _same(value: float) -> float:
    return float(value)


def _mib_to_bytes(value: float) -> float:
    return float(value) * MIB


# (DCGM field id, metric name as dcgm-exporter and DCGM <= 4.5 spell it, canonical, convert)
DCGM_FIELDS: tuple[tuple[int, str, str, Callable[[float], float]], ...] = (
    (1001, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_engine_active", _same),
    (1002, "DCGM_FI_PROF_SM_ACTIVE", "sm_active", _same),
    (1003, "DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy", _same),
    (1004, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active", _same),
    (1005, "DCGM_FI_PROF_DRAM_ACTIVE", "dram_active", _same),
    (1006, "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64_active", _same),
    (1007, "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32_active", _same),
    (1008, "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16_active", _same),
    (1009, "DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes_per_s", _same),
    (1010, "DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes_per_s", _same),
    (100, "DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", _same),
    (101, "DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", _same),
    (112, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clocks_event_reasons", _same),
    (150, "DCGM_FI_DEV_GPU_TEMP", "temperature_c", _same),
    (155, "DCGM_FI_DEV_POWER_USAGE", "power_w", _same),
    (203, "DCGM_FI_DEV_GPU_UTIL", "gpu_util", _same),
    (204, "DCGM_FI_DEV_MEM_COPY_UTIL", "mem_util", _same),
    (230, "DCGM_FI_DEV_XID_ERRORS", "xid_last", _same),
    (251, "DCGM_FI_DEV_FB_FREE", "fb_free_bytes", _mib_to_bytes),
    (252, "DCGM_FI_DEV_FB_USED", "fb_used_bytes", _mib_to_bytes),
)

BY_FIELD_ID = {fid: (canonical, convert) for fid, _n, canonical, convert in DCGM_FIELDS}
BY_METRIC_NAME = {name: (canonical, convert) for _f, name, canonical, convert in DCGM_FIELDS}
# The deprecated throttle-reasons spelling is still emitted by older exporters.
BY_METRIC_NAME["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] = BY_FIELD_ID[112]


def from_dcgm_ids(values: Mapping[int, float]) -> dict[str, float]:
    """``{field_id: value}`` (DcgmReader's shape) -> canonical counters, blanks dropped."""
    counters = {}
    for field_id, value in values.items():
        known = BY_FIELD_ID.get(field_id)
        if known is not None and value is not None and not is_blank(float(value)):
            canonical, convert = known
            counters[canonical] = convert(float(value))
    return counters
