"""The binder's decisions without a cluster: its line of binds per node (a pod's next
try, a lease given back), the pod read back after an unsure Binding, which errors are sure
refusals; and how the REST adapter tells a request never sent from one unanswered."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.kubeapi.port import Conflict, Gone, KubeError, NotFound, Unanswered
from agent.kubeapi.rest import RestKubeApi
from agent.legacy.cluster.binding import Outcome, binding_outcome, refused
from agent.legacy.cluster.line import Line
from agent.legacy.podleases import LEASE_ANNOTATION
from tests.kube.binder_world import BINDING, NS
from tests.kubeworld.apiserver import FakeApiServer, Obj

pytestmark = pytest.mark.timeout(120)


def test_a_pods_next_try_takes_the_place_of_its_turn_that_kept_the_lease() -> None:
    line = Line()
    kept = line.join()
    line.start(kept)
    nxt, later = line.join(), line.join()  # waiting for kept's lease to be allocated
    line.end(kept, "L1", 1.0)
    again = line.rejoin(kept)
    assert again.previous is None  # it waits for nobody, its own lease least of all
    assert (nxt.previous, later.previous) == (again, nxt)
    assert nxt.moved.is_set()  # woken to wait for the try that binds L1
    assert line.waiting == [again, nxt, later]


def test_a_pods_next_try_after_the_line_moved_on_goes_ahead_of_the_pods_waiting() -> None:
    line = Line()
    kept = line.join()
    line.start(kept)
    line.end(kept, "L1", 1.0)
    nxt = line.join()
    line.start(nxt)  # its hold passed: it went on
    waiting = line.join()
    again = line.rejoin(kept)
    assert (again.previous, waiting.previous) == (nxt, again)
    assert line.waiting == [again, waiting]


def test_a_lease_given_back_lets_the_turn_waiting_for_it_go() -> None:
    line = Line()
    kept = line.join()
    line.start(kept)
    nxt = line.join()
    line.end(kept, "L1", 1.0)
    line.gave_back(kept)
    assert kept.lease_id == "" and nxt.moved.is_set()


def _pod(node: str = "", lease: str = "", uid: str = "u1") -> Obj:
    return {
        "metadata": {"uid": uid, "annotations": {LEASE_ANNOTATION: lease} if lease else {}},
        "spec": {"nodeName": node} if node else {},
    }


@pytest.mark.parametrize(
    ("pod", "outcome", "why"),
    [
        (_pod("n1", "L1"), Outcome.BOUND, ""),
        (None, Outcome.NOT_BOUND, "the pod is gone"),
        (_pod("n1", "L1", uid="u2"), Outcome.NOT_BOUND, "another pod of that name"),
        (_pod(), Outcome.NOT_BOUND, "the pod is not bound"),
        (_pod("n2", "L1"), Outcome.NOT_BOUND, "the pod is bound to n2"),
        (_pod("n1", "L2"), Outcome.NOT_BOUND, "the pod is bound with lease L2"),
        (_pod("n1"), Outcome.BOUND, ""),  # no annotation: the lease is the pod's own
    ],
)
def test_the_pod_read_back_decides(pod: Obj | None, outcome: Outcome, why: str) -> None:
    assert binding_outcome(pod, "u1", "n1", "L1") == (outcome, why)


@pytest.mark.parametrize(
    ("error", "sure"),
    [
        (KubeError(422, "Invalid", ""), True),
        (Gone(410, "Expired", ""), True),
        (NotFound(404, "NotFound", ""), True),
        (KubeError(429, "TooManyRequests", ""), True),
        (KubeError(0, "Unreachable", "connection refused"), True),  # never sent
        (Conflict(409, "Conflict", ""), False),  # bound already: by this bind, maybe
        (KubeError(500, "InternalError", ""), False),
        (KubeError(504, "Timeout", ""), False),
        (Unanswered(0, "Unreachable", "timed out"), False),
        (KubeError(201, "BadResponse", "not JSON"), False),  # answered 201: it landed
    ],
)
def test_only_a_refusal_is_sure_to_have_changed_nothing(error: KubeError, sure: bool) -> None:
    assert refused(error) is sure


async def test_the_rest_adapter_tells_a_request_never_sent_from_one_unanswered(
    root: Path,
) -> None:
    async with FakeApiServer() as server:
        server.create_pod("p", NS)
        async with RestKubeApi.from_url(server.url, timeout_s=0.5) as kube:
            server.fail_next("POST", BINDING.format(name="p"), hang=True)
            with pytest.raises(Unanswered):
                await kube.bind_pod(NS, "p", "", "n1")
            server.fail_next("POST", BINDING.format(name="p"), landed=True)
            with pytest.raises(Unanswered):
                await kube.bind_pod(NS, "p", "", "n1")
        url = server.url
    async with RestKubeApi.from_url(url, timeout_s=0.5) as kube:  # nobody listens there
        with pytest.raises(KubeError) as caught:
            await kube.bind_pod(NS, "p", "", "n1")
        assert not isinstance(caught.value, Unanswered)
        assert (caught.value.status, caught.value.reason) == (0, "Unreachable")
