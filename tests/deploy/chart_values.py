"""What the chart-defaults tests share: the chart's default values, the namespace of the
release they render in another namespace than gpushare-system, and a pod's containers and
arguments."""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy.test_chart import CHART, pod_of

NAMESPACE = "team-gpu"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def args_of(container: dict[str, Any]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in container["args"] if a.startswith("--") and "=" in a)


def container_of(docs: list[dict[str, Any]], kind: str, name: str, container: str) -> Any:
    return next(c for c in pod_of(docs, kind, name)["containers"] if c["name"] == container)
