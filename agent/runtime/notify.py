"""systemd readiness notification (``Type=notify``) without libsystemd: one datagram to
``$NOTIFY_SOCKET`` (a path, or an abstract socket when it starts with ``@``). Nothing
happens when the variable is unset, and a failure to notify is logged, never fatal."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``READY=1``, ``STOPPING=1``); True when it was sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("cannot notify systemd (%s): %s", state, exc)
        return False
    return True
