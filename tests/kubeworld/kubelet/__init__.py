"""The kubelet stand-ins, one per path: :mod:`.dra` (the kubelet's DRA side: plugin
registration, health, NodePrepareResources / NodeUnprepareResources, pods run through CDI)
and :mod:`.device_plugin` (the device-plugin and pod-resources APIs)."""

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
