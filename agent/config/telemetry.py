"""Where the GPU counters come from and how they are sampled into windows."""

from __future__ import annotations

from dataclasses import dataclass

from agent.config.fields import setting


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    source: str = setting(
        "auto",
        "Counter source. 'auto': the simulated node's own on --sim; otherwise DCGM if its "
        "bindings and host engine answer, then dcgm-exporter at exporter_url, then NVML.",
        choices=("auto", "dcgm", "exporter", "nvml", "sim"),
    )
    exporter_url: str = setting(
        "http://127.0.0.1:9400/metrics", "The dcgm-exporter endpoint to scrape."
    )
    exporter_timeout_s: float = setting(2.0, "Seconds a scrape of the exporter may take.", min=0.05)
    dcgm_host: str = setting("localhost", "The DCGM host engine (nv-hostengine) to connect to.")
    keep_windows: int = setting(
        60, "Closed windows kept per device (memory is bounded by this).", min=1
    )
    sample_interval_s: float = setting(
        1.0, "Seconds between two counter samples of every device.", min=0.01
    )
    window_s: float = setting(10.0, "Length in seconds of a fixed aggregation window.", min=0.01)
    stale_after_s: float = setting(
        5.0,
        "A device whose newest sample is older than this is 'stale': no decision uses it.",
        min=0.01,
    )
