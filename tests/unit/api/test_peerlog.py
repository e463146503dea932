"""A write to a caller that went away is a one-line warning naming the stream, never a
traceback; anything else gRPC logs passes as it is."""

from __future__ import annotations

import io
import logging

from grpc._cython import cygrpc

from agent.api.peerlog import GRPC_LOGGER, PeerGoneFilter, quiet_peer_gone


def logged(exc: BaseException, message: str) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger(f"{GRPC_LOGGER}.test")
    logger.addFilter(PeerGoneFilter())
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise exc
        except type(exc):
            logger.exception(message)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_a_failed_write_to_a_gone_peer_is_one_warning_naming_the_stream() -> None:
    text = logged(
        cygrpc.ExecuteBatchError('Failed "execute_batch": (<SendMessageOperation>,)'),
        "ExecuteBatchError raised in core by servicer method [/gpushare.v1.Agent/WatchEvents]",
    )
    assert text.count("\n") == 1, text
    assert text.startswith("WARNING ")
    assert "/gpushare.v1.Agent/WatchEvents" in text and "went away" in text
    assert "Traceback" not in text


def test_other_errors_keep_their_traceback() -> None:
    text = logged(ValueError("a real bug"), "Unexpected error in servicer method [/x/Y]")
    assert text.startswith("ERROR ") and "Traceback" in text and "a real bug" in text


def test_the_filter_is_installed_once() -> None:
    quiet_peer_gone()
    quiet_peer_gone()
    filters = logging.getLogger(GRPC_LOGGER).filters
    assert sum(isinstance(f, PeerGoneFilter) for f in filters) == 1
