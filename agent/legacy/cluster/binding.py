"""A pod's Binding and what became of it.

The Binding carries the lease as its annotation (the API server copies it onto the pod in
the same write that sets the node). Its answer is sure when it is a success or a refusal
that changed nothing: a 4xx other than a 409, or no connection at all. A 5xx, a timeout or
a broken connection may have landed, now or later (the API server may apply a write after
its client gave up): the same Binding is sent again, with backoff, for at most
``resolve_s``. The API server applies one Binding of a pod and answers any other with a
409, so the pod ends bound with this lease either way, and the answers become sure: a
success, or a 409 after which the pod is read back (:func:`binding_outcome` decides from
what it shows). Only when no Binding is answered within ``resolve_s``, or the pod cannot
be read back, is the outcome unknown: nothing is guessed.
"""

from __future__ import annotations

import asyncio
import enum
import logging

from agent.kubeapi.port import KubeApi, KubeError, NotFound, Obj, Unanswered, annotations_of
from agent.legacy.cluster.bounded import printable
from agent.legacy.podleases import LEASE_ANNOTATION

log = logging.getLogger(__name__)

READ_BACK_FIRST_S = 0.1  # the first wait before reading a pod back again
READ_BACK_MAX_S = 2.0


class Outcome(enum.Enum):
    """What became of a Binding."""

    BOUND = "bound"  # the pod is bound to the node with the lease
    NOT_BOUND = "not bound"  # it is not, and this Binding can no longer make it so
    UNKNOWN = "unknown"  # it may be: the pod could not be read back


def refused(error: KubeError) -> bool:
    """Sure to have changed nothing: the server refused (a 4xx other than a 409, which
    may answer a Binding that landed before), or the request never left (no
    connection). A 5xx, a timeout or a broken connection may have landed."""
    if error.status == 0:
        return not isinstance(error, Unanswered)
    return 400 <= error.status < 500 and error.status != 409


def binding_outcome(pod: Obj | None, uid: str, node: str, lease_id: str) -> tuple[Outcome, str]:
    """The outcome of a Binding of pod ``uid`` to ``node`` with ``lease_id``, from the pod
    read back (None: gone), and why it is not bound. A pod bound there without a lease
    annotation is bound with its own lease, as the lease controller reads it."""
    if pod is None:
        return Outcome.NOT_BOUND, "the pod is gone"
    if uid and pod["metadata"].get("uid") != uid:
        return Outcome.NOT_BOUND, "another pod of that name"
    bound = (pod.get("spec") or {}).get("nodeName") or ""
    if not bound:
        return Outcome.NOT_BOUND, "the pod is not bound"
    if bound != node:
        return Outcome.NOT_BOUND, f"the pod is bound to {bound}"
    with_lease = annotations_of(pod).get(LEASE_ANNOTATION, "")
    if with_lease and with_lease != lease_id:
        return Outcome.NOT_BOUND, f"the pod is bound with lease {with_lease}"
    return Outcome.BOUND, ""


async def bind(
    api: KubeApi, meta: Obj, node: str, lease_id: str, *, resolve_s: float
) -> tuple[Outcome, str]:
    """Create the pod's Binding to ``node`` with ``lease_id``, again while its answer is
    not sure (see the module's text). (outcome, why it is not bound)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + resolve_s
    delay_s = READ_BACK_FIRST_S
    first: KubeError | None = None
    while True:
        try:
            await api.bind_pod(
                meta["namespace"],
                meta["name"],
                meta["uid"],
                node,
                annotations={LEASE_ANNOTATION: lease_id},
            )
        except KubeError as exc:
            failure = exc
        else:
            if first is not None:
                log.info(
                    "binding of %s to %s sent again: bound (after: %s)", *_named(meta, node), first
                )
            return Outcome.BOUND, ""
        why = f"binding to {node} failed: {failure}"
        if first is None and refused(failure):  # sure: no Binding of this bind was made
            return Outcome.NOT_BOUND, why
        first = first or failure
        conflict = failure.status == 409  # a Binding of the pod landed: this one, or another
        if conflict or refused(failure) or loop.time() + delay_s > deadline:
            return await _read_back_outcome(
                api, meta, (node, lease_id), why, deadline=deadline, landed=conflict
            )
        await asyncio.sleep(delay_s)
        delay_s = min(delay_s * 2, READ_BACK_MAX_S)


async def _read_back_outcome(
    api: KubeApi, meta: Obj, binding: tuple[str, str], why: str, *, deadline: float, landed: bool
) -> tuple[Outcome, str]:
    """What the pod shows once a Binding of it ``landed`` (a 409), or its answers stayed
    unsure. Unbound after unsure answers, a Binding may still land: unknown, like a pod
    that cannot be read back."""
    node, lease_id = binding
    kept = f"lease {lease_id} is kept until it is known whether the pod is bound"
    left_s = max(deadline - asyncio.get_running_loop().time(), READ_BACK_FIRST_S)
    try:
        found = await read_back(api, meta["namespace"], meta["name"], resolve_s=left_s)
    except KubeError as exc:
        log.warning("binding of %s to %s: outcome unknown: %s", *_named(meta, node), exc)
        return Outcome.UNKNOWN, f"{why}; the pod could not be read back ({exc}): {kept}"
    outcome, not_bound = binding_outcome(found, meta["uid"], node, lease_id)
    if outcome is Outcome.BOUND:
        log.info("binding of %s to %s landed despite: %s", *_named(meta, node), why)
    elif not landed and found is not None and not (found.get("spec") or {}).get("nodeName"):
        return Outcome.UNKNOWN, f"{why} ({not_bound} yet): {kept}"
    return outcome, f"{why} ({not_bound})"


def _named(meta: Obj, node: str) -> tuple[str, str]:
    return printable(str(meta.get("name", ""))), printable(node)


async def read_back(api: KubeApi, namespace: str, name: str, *, resolve_s: float) -> Obj | None:
    """The pod as the API server has it now (None: gone), read again with backoff for at
    most ``resolve_s`` in all; the last error once that has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + resolve_s
    delay_s = READ_BACK_FIRST_S
    while True:
        try:
            async with asyncio.timeout(max(deadline - loop.time(), READ_BACK_FIRST_S)):
                return await api.get_pod(namespace, name)
        except NotFound:
            return None
        except KubeError:
            if loop.time() + delay_s > deadline:
                raise
        except TimeoutError as exc:
            raise Unanswered(0, "Unreachable", f"no answer within {resolve_s:g} s") from exc
        await asyncio.sleep(delay_s)
        delay_s = min(delay_s * 2, READ_BACK_MAX_S)
