"""``gpushare profile``: measure workloads alone and in pairs under MPS, write run records.

For one device: start its MPS control daemon, run each workload alone (full threads) while
sampling the device's counters, then alone at each given thread percentage under 100 (its
counters at that share: MPS shares bound the SMs a client may use, and what it then keeps
busy is not a fixed fraction of its full-device counters), then every pair at every given
thread percentage. A workload's throughput is read from its own output with a regular
expression (the mean of every match after a warm-up); retention = throughput in the pair /
throughput alone at full threads. Each pair gives two records in the estimator's format,
the solo counters being each workload's own window means, ``share_counters`` its window
means at each share.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from agent.core.errors import ValidationError
from agent.core.types import Device
from agent.core.units import parse_bytes
from agent.estimator.records import Record, Workload
from agent.gpu.port import TelemetrySource
from agent.mps.limits import client_environment
from agent.mps.supervisor import DaemonSupervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    command: tuple[str, ...]
    throughput_regex: re.Pattern[str]
    memory_bytes: int


def parse_spec(text: str, source: str) -> list[WorkloadSpec]:
    body = yaml.safe_load(text)
    if not isinstance(body, dict) or body.get("version") != 1:
        raise ValidationError(source, "must be a mapping with version: 1 and workloads")
    entries = body.get("workloads")
    if not isinstance(entries, list) or len(entries) < 1:
        raise ValidationError(f"{source}: workloads", "must be a non-empty list")
    specs = []
    for i, entry in enumerate(entries):
        where = f"{source}: workloads[{i}]"
        if not isinstance(entry, dict):
            raise ValidationError(where, "must be a mapping")
        command = entry.get("command")
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(c, str) for c in command)
        ):
            raise ValidationError(f"{where}.command", "must be a list of strings")
        try:
            pattern = re.compile(str(entry.get("throughput_regex", "")))
        except re.error as exc:
            raise ValidationError(f"{where}.throughput_regex", str(exc)) from exc
        if pattern.groups < 1:
            raise ValidationError(f"{where}.throughput_regex", "needs a group for the number")
        specs.append(
            WorkloadSpec(
                str(entry.get("name") or f"w{i}"),
                tuple(command),
                pattern,
                parse_bytes(str(entry.get("memory", "1GiB"))),
            )
        )
    return specs


@dataclass
class Measured:
    throughput: float
    counters: dict[str, float]


class Profiler:
    def __init__(
        self,
        device: Device,
        supervisor: DaemonSupervisor,
        telemetry: TelemetrySource,
        *,
        duration_s: float,
        warmup_s: float,
        sample_interval_s: float = 1.0,
    ) -> None:
        self.device = device
        self.supervisor = supervisor
        self.telemetry = telemetry
        self.duration_s = duration_s
        self.warmup_s = warmup_s
        self.sample_interval_s = sample_interval_s

    async def run(
        self, specs: Sequence[WorkloadSpec], thread_pcts: Sequence[float]
    ) -> list[Record]:
        solo = {}
        shares: dict[str, dict[float, dict[str, float]]] = {}
        for spec in specs:
            log.info("profiling %s alone", spec.name)
            (solo[spec.name],) = await self._measure([(spec, 100.0)])
            shares[spec.name] = {}
            for pct in sorted({p for p in thread_pcts if p < 100.0}):
                log.info("profiling %s alone at %g%% of the threads", spec.name, pct)
                (at_share,) = await self._measure([(spec, pct)])
                shares[spec.name][pct] = at_share.counters
        records = []
        for a, b in itertools.combinations(specs, 2):
            for pct_a, pct_b in itertools.product(thread_pcts, repeat=2):
                log.info("profiling %s (%g%%) with %s (%g%%)", a.name, pct_a, b.name, pct_b)
                pair = await self._measure([(a, pct_a), (b, pct_b)])
                records += self._records([(a, pct_a), (b, pct_b)], pair, solo, shares)
        return records

    def _records(
        self,
        members: Sequence[tuple[WorkloadSpec, float]],
        pair: list[Measured],
        solo: Mapping[str, Measured],
        shares: Mapping[str, Mapping[float, Mapping[str, float]]],
    ) -> list[Record]:
        workloads = [
            Workload(s.name, pct, s.memory_bytes, solo[s.name].counters, "", shares.get(s.name, {}))
            for s, pct in members
        ]
        device_counters = pair[0].counters
        records = []
        for i, (spec, _pct) in enumerate(members):
            alone = solo[spec.name].throughput
            retention = pair[i].throughput / alone if alone > 0 else 0.0
            peers = tuple(w for j, w in enumerate(workloads) if j != i)
            records.append(
                Record(
                    self.device.model,
                    self.device.memory_bytes,
                    workloads[i],
                    peers,
                    device_counters,
                    round(retention, 4),
                )
            )
        return records

    async def _measure(self, members: Sequence[tuple[WorkloadSpec, float]]) -> list[Measured]:
        processes = [await self._start(spec, pct) for spec, pct in members]
        readers = [
            asyncio.create_task(_throughputs(p, spec.throughput_regex))
            for p, (spec, _pct) in zip(processes, members, strict=True)
        ]
        counters = await self._sample()
        for process in processes:
            if process.returncode is None:
                process.terminate()
        for process in processes:
            await process.wait()
        results = []
        for reader, (spec, _pct) in zip(readers, members, strict=True):
            values = await reader
            kept = [v for at, v in values if at >= self.warmup_s] or [v for _at, v in values]
            if not kept:
                raise ValidationError(spec.name, "printed no throughput matching its regex")
            results.append(Measured(statistics.fmean(kept), dict(counters)))
        return results

    async def _start(self, spec: WorkloadSpec, pct: float) -> asyncio.subprocess.Process:
        env = {
            **os.environ,
            **client_environment(
                self.device,
                self.supervisor.paths,
                thread_pct=pct,
                memory_bytes=spec.memory_bytes,
                lease_id=f"profile-{spec.name}",
            ),
        }
        return await asyncio.create_subprocess_exec(
            *spec.command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env=env,
        )

    async def _sample(self) -> dict[str, float]:
        sums: dict[str, float] = {}
        count = 0
        deadline = time.monotonic() + self.duration_s
        while time.monotonic() < deadline:
            await asyncio.sleep(self.sample_interval_s)
            for sample in await self.telemetry.read([self.device]):
                for name, value in sample.counters.items():
                    sums[name] = sums.get(name, 0.0) + value
                count += 1
        return {name: value / max(count, 1) for name, value in sums.items()}


async def _throughputs(
    process: asyncio.subprocess.Process, pattern: re.Pattern[str]
) -> list[tuple[float, float]]:
    """(seconds since start, value) for every line matching the throughput regex."""
    assert process.stdout is not None
    started = time.monotonic()
    values = []
    while line := await process.stdout.readline():
        match = pattern.search(line.decode(errors="replace"))
        if match:
            try:
                values.append((time.monotonic() - started, float(match.group(1))))
            except ValueError:
                continue
    return values


def load_spec(path: str) -> list[WorkloadSpec]:
    try:
        return parse_spec(Path(path).read_text(), path)
    except OSError as exc:
        raise ValidationError(path, f"cannot read: {exc.strerror}") from exc
