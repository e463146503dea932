"""Does the MPS control binary belong to the running driver?

The control daemon and the server it starts talk to the kernel driver; binaries of another
driver release (an image's own package, a host upgraded under a running container) fail in
ways that look like GPU faults. The binary prints no version (``-v`` exists only on newer
releases), but it carries its release as a string (``535.309.01``), which NVML's driver
version must equal.
"""

from __future__ import annotations

import logging
import re

from agent.core.errors import MpsError

log = logging.getLogger(__name__)

RELEASE = re.compile(rb"\x00(\d{3}\.\d{1,3}(?:\.\d{1,3})?)\x00")
MAX_BINARY_BYTES = 16 * 2**20


def embedded_release(binary: bytes) -> str | None:
    """The one driver release the binary names, or None (none, or several)."""
    found = {m.group(1).decode() for m in RELEASE.finditer(binary)}
    return found.pop() if len(found) == 1 else None


def mismatch(binary_path: str, binary_release: str | None, driver: str | None) -> str | None:
    """Why the binary may not be used with this driver, or None when it may (or when
    either version is unknown)."""
    if binary_release is None or driver is None or binary_release == driver:
        return None
    return (
        f"{binary_path} is from driver release {binary_release} but the running driver is "
        f"{driver}: use the driver's own MPS binaries (under Kubernetes the NVIDIA container "
        "toolkit mounts them from the host's driver root), or point mps.control_binary at them"
    )


def check_release(binary_path: str, driver: str | None) -> None:
    """Refuse a control binary of another driver release; say so when it cannot be told."""
    try:
        with open(binary_path, "rb") as f:
            release = embedded_release(f.read(MAX_BINARY_BYTES))
    except OSError as exc:
        raise MpsError(f"cannot read {binary_path}: {exc.strerror}") from exc
    why = mismatch(binary_path, release, driver)
    if why is not None:
        raise MpsError(why)
    if driver is not None and release is None:
        log.warning("cannot tell which driver release %s is from; not checked", binary_path)
    elif driver is not None:
        log.info("MPS control binary %s matches driver %s", binary_path, driver)
