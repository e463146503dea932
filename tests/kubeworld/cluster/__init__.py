"""Loopback clusters of either path, every part real but those no machine here runs (the
API server, the kubelet, the scheduler: the test world's stand-ins).

    async with cluster("dra", root, nodes=2) as world: ...            # a DraCluster
    async with cluster("device-plugin", root) as (world, scheduler): ...

:func:`cluster` builds the one a path names; :func:`~.device_plugin.loopback_cluster` and
:func:`~.dra.dra_cluster` (the same, by name) take each path's own options."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from tests.kubeworld.cluster.device_plugin import loopback_cluster
from tests.kubeworld.cluster.dra import dra_cluster

PATHS: dict[str, Callable[..., AbstractAsyncContextManager[Any]]] = {
    "device-plugin": loopback_cluster,
    "dra": dra_cluster,
}


def cluster(path: str, root: Path, **options: Any) -> AbstractAsyncContextManager[Any]:
    """The loopback cluster of ``path`` (``device-plugin`` or ``dra``) under ``root``, with
    that path's ``options``."""
    if path not in PATHS:
        raise ValueError(f"no cluster of path {path!r}: one of {', '.join(PATHS)}")
    return PATHS[path](root, **options)


__all__ = ["PATHS", "cluster", "dra_cluster", "loopback_cluster"]
