"""The ``gpushare.io/lease`` finalizer a share pod carries until its lease is released:
who holds it, and removing ours (and only ours) without losing a concurrent change."""

from __future__ import annotations

import logging

from agent.kubeapi.port import Conflict, KubeApi, NotFound, Obj
from agent.legacy.cluster.annotations import FINALIZER

log = logging.getLogger(__name__)


async def drop_finalizer(api: KubeApi, pod: Obj) -> bool:
    """Remove our finalizer, and only ours, compare-and-set on the resourceVersion (409:
    read again); False when it could not be removed (conflicts every time)."""
    meta = pod["metadata"]
    for _ in range(5):
        finalizers = meta.get("finalizers") or []
        kept = [f for f in finalizers if f != FINALIZER]
        if len(kept) == len(finalizers):
            return True  # dropped already (a settling sent twice)
        patch = {"metadata": {"finalizers": kept, "resourceVersion": meta["resourceVersion"]}}
        try:
            await api.patch_pod(meta["namespace"], meta["name"], patch)
            return True
        except Conflict:
            meta = (await api.get_pod(meta["namespace"], meta["name"]))["metadata"]
        except NotFound:
            return True
    log.warning("finalizer of %s/%s not removed: conflicts", meta["namespace"], meta["name"])
    return False


def holds_finalizer(pod: Obj) -> bool:
    return FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or [])
