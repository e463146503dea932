"""Fixtures shared by the chart's checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.job_pod import JobPod, make_job_pod


@pytest.fixture
def job_pod(tmp_path: Path) -> JobPod:
    """A hook Job's pod, simulated: service account files, environment, the API's TLS."""
    return make_job_pod(tmp_path / "job-pod")
