"""DRA request ids and the one-share rule."""

from __future__ import annotations

import pytest

from agent.claims.shares import claim_uid_of, one_share_per_request, share_of, share_request_id
from agent.dra.claims import ClaimError, Share

SHARE = Share("gpu", "gpu-0", "5e0e2d4c-1111-4222-8333-444455556666", None, None)


def test_request_ids_name_the_claim_and_the_share() -> None:
    first = share_request_id("c-uid", SHARE)
    again = share_request_id("c-uid", SHARE, 1796466555089629700)
    assert first == f"dra:c-uid:{SHARE.share_id}"
    assert [claim_uid_of(x) for x in (first, again)] == ["c-uid", "c-uid"]
    assert [share_of(x) for x in (first, again)] == [SHARE.share_id, SHARE.share_id]
    assert claim_uid_of("pod-uid/1") is None


def test_a_request_gets_one_share_per_node_and_a_claim_one_per_request() -> None:
    one_share_per_request([SHARE])
    one_share_per_request([SHARE, Share("sidecar", "gpu-0", "s2", None, None)])
    with pytest.raises(ClaimError, match="ONE_SHARE_PER_REQUEST: request 'gpu' holds 2"):
        one_share_per_request([SHARE, Share("gpu", "gpu-1", "s2", None, None)])
