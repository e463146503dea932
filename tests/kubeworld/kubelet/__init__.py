"""The kubelet stand-ins, one per path: :mod:`.dra` (the kubelet's DRA side: plugin
registration, health, NodePrepareResources / NodeUnprepareResources, pods run through CDI).
The device-plugin path's kubelet stays in ``tests/kubelet/fake_kubelet.py``, beside the
tests of the agent's device plugin that drive it."""

from __future__ import annotations

from tests.kubeworld.kubelet.dra import DraKubelet
from tests.kubeworld.kubelet.plugins import (
    CdiError,
    DraKubeletError,
    FakeContainer,
    PodStartError,
    PreparedDevice,
    Retry,
)

__all__ = [
    "CdiError",
    "DraKubelet",
    "DraKubeletError",
    "FakeContainer",
    "PodStartError",
    "PreparedDevice",
    "Retry",
]
