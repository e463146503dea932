"""A pod's lease on the legacy path, as both of its sides name it: the request id the
binder admits a pod with (made of the pod's UID) and the pod annotation naming its lease
(the binder sets it with the Binding; the device plugin and the NRI plugin put it on the
containers they give the lease to). Pure."""

from __future__ import annotations

LEASE_ANNOTATION = "gpushare.io/lease"


def pod_request_id(uid: str, attempt: int = 0) -> str:
    """The request id of a Kubernetes pod's ``attempt``-th lease: its UID, then
    ``<uid>/<n>``. A pod whose lease ended before it was bound (a failed bind gave it back,
    its gang was aborted) needs a new request id: the agent never reuses the id of an
    ended lease."""
    return uid if attempt == 0 else f"{uid}/{attempt}"


def pod_uid_of(request_id: str) -> str:
    """The pod UID a request id was made from (:func:`pod_request_id`)."""
    return request_id.partition("/")[0]
