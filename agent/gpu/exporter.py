"""Counters scraped from a dcgm-exporter endpoint (Prometheus text) with aiohttp.

Metric names are the exporter's ``DCGM_FI_*`` names; each series is matched to a device by
its ``UUID`` (or ``uuid``) label, and for MIG by the parent GPU's UUID plus
``GPU_I_ID``. Series for GPUs the agent
does not know are ignored: such a device gets no sample and goes stale. Blank sentinels
(not supported, not found) are dropped. Any failure (status, timeout, truncated or invalid
body) raises :class:`TelemetryError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from agent.core.errors import TelemetryError
from agent.core.samples import Sample
from agent.core.types import Device
from agent.gpu.fields import BY_METRIC_NAME, is_blank

UUID_LABELS = ("UUID", "uuid", "gpu_uuid")


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(metric name, labels, value) for every sample of a Prometheus text body."""
    try:
        return [
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except (ValueError, IndexError, KeyError) as exc:
        raise TelemetryError(f"unreadable exporter answer: {exc}") from exc


def device_key(labels: Mapping[str, str]) -> tuple[str, str | None] | None:
    """(GPU UUID, MIG GPU instance id or None) of a series, or None if it names no GPU."""
    uuid = next((labels[k] for k in UUID_LABELS if labels.get(k)), None)
    if uuid is None:
        return None
    return uuid, labels.get("GPU_I_ID") or None


def samples_from(
    series: Sequence[tuple[str, dict[str, str], float]],
    devices: Sequence[Device],
    *,
    taken_at: float,
) -> list[Sample]:
    """Group series into one sample per known device, with canonical names."""
    keys = _device_keys(devices)
    counters: dict[str, dict[str, float]] = {}
    for name, labels, value in series:
        known = BY_METRIC_NAME.get(name.removesuffix("_total"))
        key = device_key(labels)
        if known is None or key is None or key not in keys or is_blank(value):
            continue
        canonical, convert = known
        counters.setdefault(keys[key], {})[canonical] = convert(value)
    return [Sample(d.uuid, taken_at, counters[d.uuid]) for d in devices if d.uuid in counters]


def _device_keys(devices: Sequence[Device]) -> dict[tuple[str, str | None], str]:
    keys: dict[tuple[str, str | None], str] = {}
    for device in devices:
        if device.parent_uuid is None:
            keys[(device.uuid, None)] = device.uuid
        elif device.gpu_instance_id is not None:
            keys[(device.parent_uuid, str(device.gpu_instance_id))] = device.uuid
    return keys


class ExporterTelemetry:
    name = "dcgm-exporter"

    def __init__(
        self, url: str, *, timeout_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self._timeout)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def read(self, devices: Sequence[Device]) -> list[Sample]:
        body = await self.fetch()
        return samples_from(parse_exposition(body), devices, taken_at=self._clock())

    async def fetch(self) -> str:
        if self._session is None:
            raise TelemetryError("the exporter source is not started")
        try:
            async with self._session.get(self.url) as response:
                if response.status != 200:
                    raise TelemetryError(f"{self.url} answered HTTP {response.status}")
                return await response.text()
        except TimeoutError as exc:
            raise TelemetryError(f"{self.url} did not answer in time") from exc
        except aiohttp.ClientError as exc:
            raise TelemetryError(f"cannot scrape {self.url}: {exc}") from exc
