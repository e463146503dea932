"""Training rows for the readiness predictor, from the ASI execution-summary table or from
the agent's own lease history. Pure: text and rows in, rows out; bad input names its line.

ASI columns (``asi_opensource_job_execution_summary``) and the attribute each becomes:
``gpu_spec_public`` -> accelerator_model, ``priority_class`` -> priority,
``job_type_public`` -> job_type, ``model_type_public`` -> model_type, ``is_genai_request``
-> generative, ``gpu_request`` -> requested_gpus, ``duration_hours`` -> declared_duration_s
(x 3600), ``schedule_delay_sec`` -> scheduling_delay_s, and concurrent_requests = the
number of spans on the same ``server_id`` in the file (the table has no start times).
``ready_status`` is the label and ``server_id`` the group for cross-validation.
``schedule_status`` and ``ready_delay_sec`` are known only after the decision: they are
never read.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.core.errors import ValidationError
from agent.core.learning import HistoryRow
from agent.estimator.readiness import Row

ASI_COLUMNS = (
    "server_id",
    "gpu_spec_public",
    "priority_class",
    "job_type_public",
    "model_type_public",
    "is_genai_request",
    "gpu_request",
    "duration_hours",
    "schedule_delay_sec",
    "ready_status",
)
NEVER_FEATURES = ("schedule_status", "ready_delay_sec")
_TRUE = {"true", "1", "t", "yes"}
_FALSE = {"false", "0", "f", "no"}


@dataclass(frozen=True)
class Dataset:
    rows: list[Row]
    labels: list[bool]
    groups: list[str]  # the machine each row ran on

    def __len__(self) -> int:
        return len(self.rows)


def _flag(value: str, where: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValidationError(where, f"is not a boolean: {value!r}")


def _number(value: str, where: str) -> float:
    if not value.strip():
        return 0.0  # "when available"
    try:
        number = float(value)
    except ValueError:
        raise ValidationError(where, f"is not a number: {value!r}") from None
    if math.isnan(number) or number < 0:
        raise ValidationError(where, f"must be a number >= 0 (got {value!r})")
    return number


def from_asi_csv(lines: Iterable[str]) -> Dataset:
    reader = csv.DictReader(lines)
    missing = [c for c in ASI_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ValidationError("header", f"missing ASI columns: {', '.join(missing)}")
    raw = []
    for number, record in enumerate(reader, start=2):
        where = f"line {number}"
        raw.append(
            (
                record["server_id"] or f"unknown-{number}",
                {
                    "accelerator_model": record["gpu_spec_public"],
                    "priority": record["priority_class"],
                    "job_type": record["job_type_public"],
                    "model_type": record["model_type_public"],
                    "generative": float(_flag(record["is_genai_request"], f"{where}: is_genai")),
                    "requested_gpus": _number(record["gpu_request"], f"{where}: gpu_request"),
                    "declared_duration_s": 3600.0
                    * _number(record["duration_hours"], f"{where}: duration_hours"),
                    "scheduling_delay_s": _number(
                        record["schedule_delay_sec"], f"{where}: schedule_delay_sec"
                    ),
                },
                _flag(record["ready_status"], f"{where}: ready_status"),
            )
        )
    per_server = Counter(server for server, _row, _label in raw)
    rows: list[Row] = [
        {**row, "concurrent_requests": float(per_server[server] - 1)} for server, row, _ in raw
    ]
    return Dataset(rows, [label for *_x, label in raw], [server for server, *_x in raw])


def from_history(history: Sequence[HistoryRow], *, machine: str) -> Dataset:
    """The agent's own ended leases, all from one machine."""
    return Dataset(
        [dict(h.attributes) for h in history],
        [h.became_ready for h in history],
        [machine] * len(history),
    )


def to_asi_csv(data: Dataset) -> list[str]:
    """Rows back in ASI columns (for synthetic data, so every source reads the same way)."""
    lines = [",".join(ASI_COLUMNS)]
    for row, label, group in zip(data.rows, data.labels, data.groups, strict=True):
        lines.append(
            ",".join(
                [
                    group,
                    str(row["accelerator_model"]),
                    str(row["priority"]),
                    str(row["job_type"]),
                    str(row["model_type"]),
                    "true" if row["generative"] else "false",
                    f"{float(row['requested_gpus']):g}",
                    f"{float(row['declared_duration_s']) / 3600.0:.6g}",
                    f"{float(row['scheduling_delay_s']):.0f}",
                    "true" if label else "false",
                ]
            )
        )
    return lines
