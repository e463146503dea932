"""The kube-scheduler stand-ins, one per path: :mod:`.extender` (the device-plugin path: an
unmodified kube-scheduler calling gpushare's extender) and :mod:`.dra` (the DRA path: the
DynamicResources plugin with its structured-parameters :mod:`.allocator`, the resourceclaim
controller's claim creation)."""

from __future__ import annotations

from tests.kubeworld.scheduler.claims import EXTENDED_ANNOTATION, POD_CLAIM_ANNOTATION
from tests.kubeworld.scheduler.dra import DraSchedulerStandIn
from tests.kubeworld.scheduler.extender import SchedulerStandIn, failed_scheduling

__all__ = [
    "EXTENDED_ANNOTATION",
    "POD_CLAIM_ANNOTATION",
    "DraSchedulerStandIn",
    "SchedulerStandIn",
    "failed_scheduling",
]
