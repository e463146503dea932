"""The entry point of ``gpushare-fake-mps-control``: the front-end on its own, with the
standard library's ``os``, ``socket`` and ``sys`` alone, and the daemon (``-d``, ``-f``)
from :mod:`agent.mps.fakebin` (``-M``: multi-user mode; ``-h`` lists the options).

The agent runs the front-end for every control command and every health probe, as it
runs the real ``nvidia-cuda-mps-control``; a simulated node runs this one instead. Kept
apart from the daemon's imports (asyncio and the fake state), a call costs a fraction of
the interpreter start it used to.
"""

from __future__ import annotations

import os
import socket
import sys

ABSENT = "Cannot find MPS control daemon process"
USAGE = """Usage: gpushare-fake-mps-control [-d | -f] [-M]
  -d  start the control daemon in the background (log in $CUDA_MPS_LOG_DIRECTORY)
  -f  start the control daemon in the foreground (log on stdout)
  -M  multi-user mode: servers of several UIDs run at once
  -h  print this help
Without -d or -f: send stdin to the daemon of $CUDA_MPS_PIPE_DIRECTORY, print its answer.
"""


def front_end() -> int:
    """Send stdin to the daemon of ``$CUDA_MPS_PIPE_DIRECTORY``; print its answer."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    request = sys.stdin.buffer.read()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.path.join(pipe, "control"))
    except OSError:
        print(ABSENT, file=sys.stderr)
        return 1
    with sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    sys.stdout.buffer.write(b"".join(chunks))
    return 0


def main() -> None:
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        sys.stdout.write(USAGE)
        sys.exit(0)
    if "-d" in args or "-f" in args:
        from agent.mps.fakebin import daemon

        sys.exit(daemon(foreground="-f" in args, multi_user="-M" in args))
    sys.exit(front_end())


if __name__ == "__main__":
    main()
