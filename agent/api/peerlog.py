"""gRPC's own log lines about a peer that went away, as one line an on-call engineer can
read.

When a caller disconnects while the agent is writing to its stream (a watcher killed, a
connection cut), grpc.aio may find out from the failed write before it has seen the
cancellation, and logs the failed batch with its traceback (logger
``grpc._cython.cygrpc``, exception ``ExecuteBatchError``). Nothing is wrong with the
agent: the write had nobody to go to. This filter turns such a record into a one-line
warning naming the stream; every other record passes as it is.
"""

from __future__ import annotations

import logging
import re

GRPC_LOGGER = "grpc._cython.cygrpc"
PEER_GONE_ERRORS = frozenset({"ExecuteBatchError"})
_METHOD = re.compile(r"\[(/[^\]\s]{1,200})\]")


class PeerGoneFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or type(exc).__name__ not in PEER_GONE_ERRORS:
            return True
        found = _METHOD.search(record.getMessage())
        stream = found.group(1) if found else "a gRPC call"
        record.msg = "stream %s: the caller went away before the agent's write reached it"
        record.args = (stream,)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def quiet_peer_gone(logger_name: str = GRPC_LOGGER) -> None:
    """Install the filter once on gRPC's logger."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, PeerGoneFilter) for f in logger.filters):
        logger.addFilter(PeerGoneFilter())
