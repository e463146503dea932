"""Files that are replaced while the agent runs (secrets mounted from Kubernetes, renewed
certificates): what says that one changed, and a loop that reloads on a change."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence

Stamp = tuple[int, int, int]  # inode, mtime (ns), size


def stamp_of(found: os.stat_result) -> Stamp:
    """A file replaced (a Secret volume swaps a link: a stat follows it to a new file) or
    rewritten has another stamp."""
    return found.st_ino, found.st_mtime_ns, found.st_size


def stamps(paths: Sequence[str]) -> tuple[Stamp | None, ...]:
    """Each path's stamp; None for one that cannot be read now."""
    found: list[Stamp | None] = []
    for path in paths:
        try:
            found.append(stamp_of(os.stat(path)))
        except OSError:
            found.append(None)
    return tuple(found)


async def reload_on_change(
    paths: Sequence[str],
    interval_s: float,
    reload: Callable[[], bool],
    *,
    seen: tuple[Stamp | None, ...] | None = None,
) -> None:
    """Call ``reload`` whenever one of ``paths`` changed since ``seen`` (their stamps when
    they were read; default: now), then since the last reload that took. ``reload`` says
    whether it took: one that did not (files caught half written) is tried again at the
    next look."""
    seen = stamps(paths) if seen is None else seen
    while True:
        await asyncio.sleep(interval_s)
        now = stamps(paths)
        if now != seen and reload():
            seen = now
