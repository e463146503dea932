"""The binder's per-node line, with writes held and released: a pod is admitted and bound
only once the pod before it on the node was allocated by the kubelet, its bind failed, or
its hold expired; a gang's members bind in lease age order before pods that came later."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from agent.api.proto import agent_pb2 as pb
from agent.kubeapi.port import Conflict, KubeError, NotFound, Obj
from agent.legacy.cluster.annotations import LEASE_ANNOTATION
from agent.legacy.cluster.binder import Binder, BindOptions

NS = "team"


def pod(name: str, *, gang: str = "", size: int = 0, node: str = "") -> Obj:
    annotations = {"gpushare.io/memory": "1Gi", "gpushare.io/threads": "10"}
    if gang:
        annotations |= {"gpushare.io/gang": gang, "gpushare.io/gang-size": str(size)}
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "annotations": annotations,
        },
        "spec": {
            "securityContext": {"runAsUser": 1000},
            "containers": [{"name": "main", "resources": {"limits": {"gpushare.io/share": 1}}}],
            **({"nodeName": node} if node else {}),
        },
    }


class Api:
    """The pods, and Bindings that wait while ``held`` is clear when asked to."""

    def __init__(self, *pods: Obj) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.bindings: list[tuple[str, str, dict[str, str]]] = []  # pod, node, annotations
        self.hold = False
        self.released = asyncio.Event()
        self.fail: dict[str, KubeError] = {}

    async def get_pod(self, namespace: str, name: str) -> Obj:
        if name not in self.pods:
            raise NotFound(404, "NotFound", name)
        return self.pods[name]

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, *, annotations: Any = None
    ) -> None:
        if self.hold:
            await self.released.wait()
        if name in self.fail:
            raise self.fail[name]
        self.bindings.append((name, node, dict(annotations or {})))
        self.pods[name]["spec"]["nodeName"] = node


class Link:
    """An agent: every call is recorded in ``calls``, in order."""

    def __init__(self, calls: list[str], clock: itertools.count[int]) -> None:
        self.calls = calls
        self.clock = clock
        self.leases: dict[str, pb.Lease] = {}  # request id -> lease

    def _lease(self, request_id: str) -> pb.AdmitResponse:
        lease = self.leases.setdefault(
            request_id,
            pb.Lease(
                lease_id=f"L-{request_id}",
                request_id=request_id,
                created_at=next(self.clock),
                priority="burstable",
                state="admitted",
            ),
        )
        return pb.AdmitResponse(decision=pb.Decision(admitted=True), lease=lease)

    async def admit(self, **fields: Any) -> pb.AdmitResponse:
        self.calls.append(f"admit {fields['pod']}")
        return self._lease(fields["request_id"])

    async def reserve(self, key: str, *, ttl_s: float, **fields: Any) -> pb.AdmitResponse:
        self.calls.append(f"reserve {fields['pod']}")
        if fields["request_id"] not in self.leases:  # reserved until its gang's commit
            self._lease(fields["request_id"])
            lease = self.leases[fields["request_id"]]
            lease.state, lease.gang_id, lease.pod = "reserved", key, fields["pod"]
        return self._lease(fields["request_id"])

    async def commit(self, key: str) -> pb.GangResponse:
        self.calls.append(f"commit {key}")
        committed = [x for x in self.leases.values() if x.state == "reserved"]
        for lease in committed:
            lease.state = "admitted"
        return pb.GangResponse(leases=committed)

    async def abort(self, key: str) -> None:
        self.calls.append(f"abort {key}")

    async def release(self, lease_id: str) -> None:
        self.calls.append(f"release {lease_id}")


class Cache:
    """The agents' cache as the binder uses it: ``allocate`` plays the kubelet."""

    def __init__(self, nodes: list[str]) -> None:
        self.calls: list[str] = []
        clock = itertools.count(1)
        self.links = {n: Link(self.calls, clock) for n in nodes}
        self.allocated: dict[str, asyncio.Event] = {}
        self.nri: set[str] = set()  # nodes whose agent's NRI plugin is registered

    def injector(self, node: str) -> str:
        return "nri" if node in self.nri else "device-plugin"

    @property
    def nodes(self) -> dict[str, Link]:
        return self.links

    def live_leases(self, node: str) -> list[Any]:
        """The node's leases as its agent's last answer shows them (every one here)."""
        from agent.legacy.cluster.views import lease_of

        return [lease_of(x) for x in self.links[node].leases.values()]

    def link(self, node: str) -> Link | None:
        return self.links.get(node)

    def why_unknown(self, node: str) -> str:
        return "no agent"

    def add_pending(self, node: str, lease: Any) -> None:
        pass

    def drop_pending(self, node: str, lease_id: str) -> None:
        pass

    def forget_assumed(self, pod_uid: str, *, only: object = None) -> None:
        pass

    def keep_assumed(self, pod_uid: str, node: str) -> None:
        pass

    def allocate(self, lease_id: str) -> None:
        self.calls.append(f"allocated {lease_id}")
        self.allocated.setdefault(lease_id, asyncio.Event()).set()

    async def wait_allocated(self, node: str, lease_id: str, timeout_s: float) -> bool:
        event = self.allocated.setdefault(lease_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


def binder(api: Api, cache: Cache, **options: float) -> Binder:
    return Binder(api, cache, BindOptions(**options))  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def until(what: Any, timeout_s: float = 2.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not what():
            await asyncio.sleep(0.001)


async def test_the_next_pod_is_admitted_only_after_the_previous_one_is_allocated() -> None:
    api, cache = Api(pod("a"), pod("b")), Cache(["n1"])
    b = binder(api, cache)
    first = asyncio.create_task(b.bind(NS, "a", "uid-a", "n1"))
    assert await first == ""
    second = asyncio.create_task(b.bind(NS, "b", "uid-b", "n1"))
    await settle()
    assert cache.calls == ["admit team/a"]  # b waits for a's Allocate, not yet asked for
    cache.allocate("L-uid-a")
    assert await second == ""
    assert cache.calls == ["admit team/a", "allocated L-uid-a", "admit team/b"]
    # the lease goes onto the pod with the Binding itself, one write
    assert api.bindings == [
        ("a", "n1", {LEASE_ANNOTATION: "L-uid-a"}),
        ("b", "n1", {LEASE_ANNOTATION: "L-uid-b"}),
    ]


async def test_other_nodes_do_not_wait() -> None:
    api, cache = Api(pod("a"), pod("b")), Cache(["n1", "n2"])
    b = binder(api, cache)
    assert await b.bind(NS, "a", "uid-a", "n1") == ""
    assert await asyncio.wait_for(b.bind(NS, "b", "uid-b", "n2"), 1) == ""


async def test_a_failed_binding_gives_its_lease_back_before_the_next_pod_is_admitted() -> None:
    api, cache = Api(pod("a"), pod("b")), Cache(["n1"])
    api.fail["a"] = KubeError(422, "Invalid", "refused: nothing landed")
    api.hold = True
    b = binder(api, cache)
    first = asyncio.create_task(b.bind(NS, "a", "uid-a", "n1"))
    second = asyncio.create_task(b.bind(NS, "b", "uid-b", "n1"))
    await settle()
    assert cache.calls == ["admit team/a"]  # a's Binding is held: b waits
    api.released.set()
    assert "refused: nothing landed" in await first
    assert await second == ""
    assert cache.calls == ["admit team/a", "release L-uid-a", "admit team/b"]


async def test_a_pod_not_allocated_within_its_hold_lets_the_next_one_go() -> None:
    api, cache = Api(pod("a"), pod("b")), Cache(["n1"])
    b = binder(api, cache, hold_s=0.2)
    assert await b.bind(NS, "a", "uid-a", "n1") == ""
    assert await asyncio.wait_for(b.bind(NS, "b", "uid-b", "n1"), 2) == ""
    assert cache.calls == ["admit team/a", "admit team/b"]


async def test_a_bind_sent_again_for_a_pod_bound_meanwhile_keeps_its_lease() -> None:
    """The binder's view showed the pod unbound; the Binding's 409 is checked, not
    answered by giving the lease back."""
    stale = pod("a")
    api, cache = Api(pod("a", node="n1")), Cache(["n1"])
    api.fail["a"] = Conflict(409, "Conflict", 'pod a is already assigned to node "n1"')
    b = Binder(api, cache, pods=lambda uid: stale)  # type: ignore[arg-type]
    assert await b.bind(NS, "a", "uid-a", "n1") == ""
    assert not [c for c in cache.calls if c.startswith("release")]


async def test_a_conflict_on_a_pod_bound_elsewhere_releases_the_lease() -> None:
    stale = pod("a")
    api, cache = Api(pod("a", node="n2")), Cache(["n1"])
    api.fail["a"] = Conflict(409, "Conflict", 'pod a is already assigned to node "n2"')
    b = Binder(api, cache, pods=lambda uid: stale)  # type: ignore[arg-type]
    assert "already assigned" in await b.bind(NS, "a", "uid-a", "n1")
    assert cache.calls == ["admit team/a", "release L-uid-a"]


async def test_the_pod_is_read_from_the_informer_when_it_has_it() -> None:
    api, cache = Api(), Cache(["n1"])  # the API has no such pod: only the informer does
    known = pod("a")
    api.pods["a"] = known
    reads: list[str] = []
    original = api.get_pod

    async def counted(namespace: str, name: str) -> Obj:
        reads.append(name)
        return await original(namespace, name)

    api.get_pod = counted  # type: ignore[method-assign]
    b = Binder(api, cache, pods={"uid-a": known}.get)  # type: ignore[arg-type]
    assert await b.bind(NS, "a", "uid-a", "n1") == ""
    assert reads == []


async def test_a_gang_commits_after_the_previous_pod_is_allocated_and_binds_before_later_pods() -> (
    None
):
    api = Api(pod("a"), pod("g0", gang="g", size=2), pod("g1", gang="g", size=2), pod("c"))
    cache = Cache(["n1"])
    b = binder(api, cache)
    assert await b.bind(NS, "a", "uid-a", "n1") == ""
    g0 = asyncio.create_task(b.bind(NS, "g0", "uid-g0", "n1"))
    g1 = asyncio.create_task(b.bind(NS, "g1", "uid-g1", "n1"))
    await settle()
    later = asyncio.create_task(b.bind(NS, "c", "uid-c", "n1"))
    await settle()
    # reserved, but not committed while a's lease is not allocated: committed, the members'
    # leases (older than a's? no: younger here, but older than any pod admitted later)
    # must not be handed a's Allocate
    assert cache.calls == ["admit team/a", "reserve team/g0", "reserve team/g1"]
    cache.allocate("L-uid-a")
    await until(lambda: len(api.bindings) == 2)
    assert "commit team/g" in cache.calls
    await settle()
    assert [name for name, _, _ in api.bindings] == ["a", "g0"]  # g1 waits for g0's Allocate
    cache.allocate("L-uid-g0")
    await until(lambda: len(api.bindings) == 3)
    assert [name for name, _, _ in api.bindings] == ["a", "g0", "g1"]
    assert not later.done()  # c came after the gang: after its last member's Allocate
    cache.allocate("L-uid-g1")
    assert await later == ""
    assert [await g0, await g1] == ["", ""]
    assert [name for name, _, _ in api.bindings] == ["a", "g0", "g1", "c"]
    assert cache.calls.index("admit team/c") > cache.calls.index("allocated L-uid-g1")


@pytest.mark.parametrize("failure", ["commit", "binding"])
async def test_a_failed_gang_frees_the_line(failure: str) -> None:
    api = Api(pod("g0", gang="g", size=2), pod("g1", gang="g", size=2), pod("c"))
    cache = Cache(["n1"])
    if failure == "commit":
        import grpc

        async def refuse(key: str) -> None:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="gang expired before it was committed",
            )

        cache.links["n1"].commit = refuse  # type: ignore[method-assign]
    else:
        api.fail["g0"] = api.fail["g1"] = KubeError(422, "Invalid", "refused")
    b = binder(api, cache, hold_s=30)
    members = [asyncio.create_task(b.bind(NS, f"g{i}", f"uid-g{i}", "n1")) for i in range(2)]
    results = await asyncio.wait_for(asyncio.gather(*members), 2)
    assert all(results), results
    # the line is free: a later pod binds at once, with no 30 s hold waited out
    assert await asyncio.wait_for(b.bind(NS, "c", "uid-c", "n1"), 2) == ""


async def test_on_a_node_with_nri_binds_wait_for_no_other() -> None:
    api, cache = Api(pod("a"), pod("b"), pod("g0", gang="g", size=2)), Cache(["n1"])
    cache.nri.add("n1")
    api.hold = True  # every Binding waits: none is allocated meanwhile
    b = binder(api, cache)
    binds = [
        asyncio.create_task(b.bind(NS, name, f"uid-{name}", "n1")) for name in ("a", "b", "g0")
    ]
    await until(lambda: len([c for c in cache.calls if c.startswith("admit")]) == 2)
    api.pods["g1"] = pod("g1", gang="g", size=2)
    binds.append(asyncio.create_task(b.bind(NS, "g1", "uid-g1", "n1")))
    await until(lambda: "commit team/g" in cache.calls)  # the gang commits at once too
    api.released.set()
    assert await asyncio.gather(*binds) == ["", "", "", ""]
    assert not any(c.startswith("allocated") for c in cache.calls)
    assert {name for name, _node, _a in api.bindings} == {"a", "b", "g0", "g1"}


async def test_settled_gangs_are_forgotten_a_ttl_after_their_deadline() -> None:
    api, cache = Api(), Cache(["n1"])
    cache.nri.add("n1")
    now = [0.0]
    b = Binder(api, cache, BindOptions(gang_ttl_s=5), clock=lambda: now[0])  # type: ignore[arg-type]
    for i in range(3):
        for member in range(2):
            name = f"g{i}-{member}"
            api.pods[name] = pod(name, gang=f"g{i}", size=2)
        api.released.set()
        binds = [b.bind(NS, f"g{i}-{m}", f"uid-g{i}-{m}", "n1") for m in range(2)]
        assert await asyncio.gather(*binds) == ["", ""]
        now[0] += 6  # one TTL past each gang's start: not yet a TTL past its deadline
    assert sorted(b._gangs) == ["team/g1", "team/g2"]  # g0's deadline was 5: forgotten at 12


async def test_a_gang_member_bound_again_commits_its_new_reservation_only_in_its_turn() -> None:
    """A member whose Binding failed after its gang's commit is reserved again (its lease
    was given back) and committed on its own: only once its turn has come. Committed
    while another pod's bind was in progress, its lease was older than that pod's and
    that pod's Allocate got it."""
    import grpc

    from agent.core.lease import ENDED_REQUEST_ID_HINT

    api = Api(pod("g0", gang="g", size=1), pod("a"))
    cache = Cache(["n1"])
    link = cache.links["n1"]
    given_back: set[str] = set()
    reserve = link.reserve

    async def release(lease_id: str) -> None:
        cache.calls.append(f"release {lease_id}")
        given_back.add(lease_id)

    async def reserve_again(key: str, *, ttl_s: float, **fields: Any) -> pb.AdmitResponse:
        if f"L-{fields['request_id']}" in given_back:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details=f"its lease was released; {ENDED_REQUEST_ID_HINT}",
            )
        return await reserve(key, ttl_s=ttl_s, **fields)

    link.release = release  # type: ignore[method-assign]
    link.reserve = reserve_again  # type: ignore[method-assign]
    b = binder(api, cache, hold_s=30, resolve_s=0.2)
    api.fail["g0"] = KubeError(422, "Invalid", "refused")  # did not land
    assert await b.bind(NS, "g0", "uid-g0", "n1") != ""
    assert "release L-uid-g0" in cache.calls
    del api.fail["g0"]
    api.hold = True  # a's Binding waits: a's bind is in progress, a not allocated
    first = asyncio.create_task(b.bind(NS, "a", "uid-a", "n1"))
    await until(lambda: "admit team/a" in cache.calls)
    again = asyncio.create_task(b.bind(NS, "g0", "uid-g0", "n1"))
    await until(lambda: cache.calls.count("reserve team/g0") == 2)
    await settle()
    assert cache.calls.count("commit team/g") == 1, cache.calls  # not yet: a is being bound
    api.released.set()
    assert await first == ""
    await settle()
    assert cache.calls.count("commit team/g") == 1, cache.calls  # a not allocated yet
    cache.allocate("L-uid-a")
    assert await asyncio.wait_for(again, 2) == ""
    second_commit = max(i for i, call in enumerate(cache.calls) if call == "commit team/g")
    assert cache.calls.index("allocated L-uid-a") < second_commit, cache.calls
    assert [name for name, _, _ in api.bindings] == ["a", "g0"]


async def test_a_commit_that_admits_fewer_members_than_were_reserved_fails_the_gang() -> None:
    """The agent commits what is reserved at that moment: a member whose reservation
    ended before (a new round of the same gang id began) would be missing. The binder
    counts the members the commit admitted: none is bound, and the one admitted is
    given back."""
    api = Api(pod("g0", gang="g", size=2), pod("g1", gang="g", size=2))
    cache = Cache(["n1"])
    link = cache.links["n1"]

    async def commit_one(key: str) -> pb.GangResponse:
        cache.calls.append(f"commit {key}")
        lease = link.leases["uid-g0"]
        lease.state = "admitted"
        return pb.GangResponse(leases=[lease])  # g1's reservation had ended

    link.commit = commit_one  # type: ignore[method-assign]
    b = binder(api, cache, hold_s=30)
    members = [asyncio.create_task(b.bind(NS, f"g{i}", f"uid-g{i}", "n1")) for i in range(2)]
    results = await asyncio.wait_for(asyncio.gather(*members), 2)
    assert all("did not admit L-uid-g1" in r for r in results), results
    assert api.bindings == []
    assert "release L-uid-g0" in cache.calls


class HeldApi(Api):
    """Bindings of the pods named in ``held`` wait until ``go`` is set; a read of a pod in
    ``unreadable`` fails."""

    def __init__(self, *pods: Obj) -> None:
        super().__init__(*pods)
        self.held: set[str] = set()
        self.go = asyncio.Event()
        self.unreadable: set[str] = set()

    async def get_pod(self, namespace: str, name: str) -> Obj:
        if name in self.unreadable:
            raise KubeError(503, "ServiceUnavailable", "etcd is slow")
        return await super().get_pod(namespace, name)

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, *, annotations: Any = None
    ) -> None:
        if name in self.held:
            await self.go.wait()
        await super().bind_pod(namespace, name, uid, node, annotations=annotations)


async def test_a_retry_in_its_kept_place_ahead_of_a_gang_is_waited_for_before_the_commit() -> None:
    """p's Binding outcome is unknown: its lease is kept and its turn ends with it. The
    gang's turn on n1 waits behind it (its hold passes: p is not allocated), then the
    commit waits on n2. p's retry takes its kept place, ahead of the gang's turn on n1:
    the commit waits for p to be bound and allocated again before it commits, or p's
    Allocate would get the gang member's older lease."""
    api = HeldApi(pod("p"), pod("a"), pod("g0", gang="g", size=2), pod("g1", gang="g", size=2))
    cache = Cache(["n1", "n2"])
    informer = {f"uid-{name}": p for name, p in api.pods.items()}
    b = Binder(api, cache, BindOptions(hold_s=0.3, resolve_s=0.1), pods=informer.get)  # type: ignore[arg-type]
    api.fail["p"] = KubeError(500, "InternalError", "etcd is down")
    api.unreadable.add("p")
    assert "is kept" in await b.bind(NS, "p", "uid-p", "n1")
    del api.fail["p"]
    api.unreadable.discard("p")
    api.held.add("a")  # a's bind on n2 is in progress while the gang waits there
    a = asyncio.create_task(b.bind(NS, "a", "uid-a", "n2"))
    await until(lambda: "admit team/a" in cache.calls)
    gang = [asyncio.create_task(b.bind(NS, f"g{i}", f"uid-g{i}", f"n{i + 1}")) for i in range(2)]
    await asyncio.sleep(0.5)  # the gang's wait on n1 is over (p's hold passed): it waits on n2
    assert "commit team/g" not in cache.calls
    p = asyncio.create_task(b.bind(NS, "p", "uid-p", "n1"))  # in its kept place
    assert await asyncio.wait_for(p, 2) == ""
    api.go.set()
    assert await asyncio.wait_for(a, 2) == ""
    cache.allocate("L-uid-a")
    await asyncio.sleep(0.1)
    assert "commit team/g" not in cache.calls, cache.calls  # p was bound: wait for it
    cache.allocate("L-uid-p")
    assert await asyncio.wait_for(asyncio.gather(*gang), 3) == ["", ""]
    assert cache.calls.index("allocated L-uid-p") < cache.calls.index("commit team/g")


async def test_a_lease_not_given_back_keeps_the_next_pod_waiting_for_its_hold() -> None:
    """a's Binding is refused (nothing landed), and its Release fails (the agent was away a
    moment): a's lease is still live for all the binder knows, so b waits for a's hold as
    after a bind that bound; b's Allocate then skips a's lease, whose hold has passed. It
    went at once before, and b's Allocate got a's lease."""
    import grpc

    api, cache = Api(pod("a"), pod("b")), Cache(["n1"])

    async def release_unavailable(lease_id: str) -> None:
        cache.calls.append(f"release {lease_id} (failed)")
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "away"
        )

    cache.links["n1"].release = release_unavailable  # type: ignore[method-assign]
    api.fail["a"] = KubeError(422, "Invalid", "refused: nothing landed")
    b = binder(api, cache, hold_s=0.5)
    assert await b.bind(NS, "a", "uid-a", "n1") != ""
    started = asyncio.get_running_loop().time()
    assert await asyncio.wait_for(b.bind(NS, "b", "uid-b", "n1"), 3) == ""
    assert asyncio.get_running_loop().time() - started >= 0.4, "b did not wait for a's hold"
    assert [name for name, _, _ in api.bindings] == ["b"]


async def test_a_bind_that_overran_its_hold_gives_its_lease_back_before_binding() -> None:
    """a's Admit is slow (its agent retried): after the hold, b goes on and is admitted. a's
    lease, granted late, would wait for its Allocate beside b's: it is given back before
    any Binding, and a is tried again later, in line."""
    api, cache = Api(pod("a"), pod("b")), Cache(["n1"])
    link = cache.links["n1"]
    admit = link.admit
    slow = asyncio.Event()

    async def slow_admit(**fields: Any) -> pb.AdmitResponse:
        if fields["pod"] == f"{NS}/a":
            await slow.wait()
        return await admit(**fields)

    link.admit = slow_admit  # type: ignore[method-assign]
    b = binder(api, cache, hold_s=0.2)
    first = asyncio.create_task(b.bind(NS, "a", "uid-a", "n1"))
    await settle()
    assert await asyncio.wait_for(b.bind(NS, "b", "uid-b", "n1"), 2) == ""
    slow.set()
    assert "took longer than the hold" in await asyncio.wait_for(first, 2)
    assert "release L-uid-a" in cache.calls
    assert [name for name, _, _ in api.bindings] == ["b"]


@pytest.mark.parametrize(
    ("reserved_s", "state", "other_pod", "running"),
    [
        (10.0, "admitted", "team/g1", True),  # its round: a member committed
        (-60.0, "ready", "team/g1", True),  # reserved before it was made, within a TTL
        (-600.0, "admitted", "team/g1", False),  # an older round of the same gang name
        (10.0, "reserved", "team/g1", False),  # not committed: the gang is being formed
        (10.0, "admitted", "team/g0", False),  # its own lease
    ],
)
def test_a_gang_is_running_for_a_pod_only_in_its_own_round(
    reserved_s: float, state: str, other_pod: str, running: bool
) -> None:
    """After a restart the binder knows a member bound again only from the agents'
    committed leases of its gang, reserved no earlier than a TTL before the pod was
    made: a gang made anew while its old members still end is not bound one by one."""
    from datetime import UTC, datetime

    from agent.legacy.cluster.gangs import Gangs
    from agent.legacy.cluster.line import Lines

    made = 1_800_000_000.0
    cache = Cache(["n1"])
    cache.links["n1"].leases["r"] = pb.Lease(
        lease_id="L-other",
        request_id="r",
        created_at=made + reserved_s,
        priority="burstable",
        state=state,
        gang_id="team/g",
        pod=other_pod,
    )
    gangs = Gangs(cache, Lines(cache, hold_s=1, clock=lambda: 0.0), ttl_s=120, clock=lambda: 0.0)  # type: ignore[arg-type]
    member = pod("g0", gang="g", size=2)
    stamp = datetime.fromtimestamp(made, UTC).isoformat().replace("+00:00", "Z")
    member["metadata"]["creationTimestamp"] = stamp
    assert gangs.running("team/g", member) is running


async def test_a_stop_while_a_gang_waits_for_its_turn_aborts_it_and_commits_nothing() -> None:
    api = Api(pod("a"), pod("g0", gang="g", size=2), pod("g1", gang="g", size=2))
    cache = Cache(["n1"])
    b = binder(api, cache, hold_s=30)
    assert await b.bind(NS, "a", "uid-a", "n1") == ""  # bound, not allocated: the gang waits
    members = [asyncio.create_task(b.bind(NS, f"g{i}", f"uid-g{i}", "n1")) for i in range(2)]
    await until(
        lambda: cache.calls.count("reserve team/g0") + cache.calls.count("reserve team/g1") == 2
    )
    await settle()
    await asyncio.wait_for(b.aclose(), 2)
    await asyncio.gather(*members, return_exceptions=True)
    assert "abort team/g" in cache.calls and "commit team/g" not in cache.calls, cache.calls
    assert [name for name, _, _ in api.bindings] == ["a"]
