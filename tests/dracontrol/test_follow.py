"""How the controller follows the claims through the API's failures and at scale: a list
or a watch that fails is tried again after a backoff that doubles (never in a hot loop),
a watch that fails resumes from where it was (no relist), the list comes in pages (all
of one snapshot, the watch from its version), and a continue token that expires between
pages lists again from the first page; every waiting claim is answered in the end."""

from __future__ import annotations

import asyncio

from agent.kubeapi.rest import RestKubeApi
from tests.dracontrol.helpers import Agents, claim, conditions, controlling, status_writes, until
from tests.kubeworld.apiserver import FakeApiServer

FOREVER = 10**6
LIST = r"(?i)/v1/resourceclaims(\?(?!.*watch=true)|$)"  # the claims of every namespace, listed
WATCH = r"(?i)/v1/resourceclaims\?.*watch=true"


def list_requests(api: FakeApiServer) -> list[str]:
    return [
        p for m, p, _ in api.log if m == "GET" and "/v1/resourceclaims?" in p and "watch" not in p
    ]


async def test_a_list_that_fails_is_tried_again_with_a_doubling_backoff(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    agents = Agents()
    api.put_object("resourceclaims", claim("c", "gpu-0"))
    outage = api.fail_next("GET", LIST, 500, times=FOREVER)
    async with controlling(kube, agents, backoff_s=0.05, backoff_max_s=0.4) as controller:
        await until(lambda: api.requests["list"] >= 2)
        await asyncio.sleep(1.2)  # 0.05 + 0.1 + 0.2 + 0.4 + 0.4: about 6 tries, not dozens
        tries = api.requests["list"]
        assert 4 <= tries <= 8, tries
        assert controller.counters.follow_failures == tries and controller.progress.failure
        assert not agents.asks and not controller.progress.listed
        api.faults.remove(outage)
        await until(lambda: bool(conditions(api)), timeout_s=3.0)
        assert controller.progress.listed and not controller.progress.failure
    assert conditions(api) == [("gpu-0", "gpushare.io/admitted", "Admitted")]


async def test_a_watch_that_fails_to_open_resumes_from_the_lists_version_without_a_relist(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    agents = Agents()
    outage = api.fail_next("GET", WATCH, 500, times=FOREVER)
    async with controlling(kube, agents, backoff_s=0.05, backoff_max_s=0.2) as controller:
        await until(lambda: api.requests["watch"] >= 3)
        api.put_object("resourceclaims", claim("c", "gpu-0"))  # after the list: a change
        await until(lambda: api.requests["watch"] >= 5)
        assert not conditions(api) and controller.counters.follow_failures >= 4
        api.faults.remove(outage)
        await until(lambda: bool(conditions(api)), timeout_s=3.0)  # the watch replays it
    assert api.requests["list"] == 1 and controller.counters.relists == 1
    assert status_writes(api) == 1


async def test_a_broken_watch_stream_resumes_without_a_relist(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    agents = Agents()
    api.fail_next("GET", WATCH, 0, times=2)  # the connection breaks (a GET is sent twice)
    async with controlling(kube, agents) as controller:
        api.put_object("resourceclaims", claim("c", "gpu-0"))
        await until(lambda: bool(conditions(api)), timeout_s=3.0)
    assert api.requests["list"] == 1 and controller.counters.relists == 1


def waiting_and_not(count: int, every: int) -> list[dict[str, object]]:
    """``count`` claims, one in ``every`` waiting for its answer (the others of a node
    without binding conditions), named in storage order."""
    return [
        claim(f"c-{i:05d}", "gpu-0", binding=i % every == 0, node=f"node-{i % 7}")
        for i in range(count)
    ]


async def test_the_list_comes_in_pages_and_every_waiting_claim_is_answered(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    made = waiting_and_not(1200, every=10)
    api.put_objects("resourceclaims", made, check_each=False)
    agents = Agents()
    async with controlling(kube, agents, page_size=500) as controller:
        await until(lambda: controller.counters.answers_written == 120, timeout_s=30.0)
        await until(lambda: not controller.owing)
        api.put_object("resourceclaims", claim("later", "gpu-0"))  # the watch follows on
        await until(lambda: bool(conditions(api, "later")), timeout_s=5.0)
    pages = list_requests(api)
    assert len(pages) == 3 and all("limit=500" in p for p in pages)
    assert ["continue=" in p for p in pages] == [False, True, True]
    assert controller.counters.list_pages == 3 and controller.counters.relists == 1
    assert controller.counters.claims_seen >= 1200
    assert sorted(name for _, name in agents.asks) == sorted(
        [str(c["metadata"]["name"]) for c in made[::10]] + ["later"]  # type: ignore[index]
    )


async def test_a_continue_token_that_expires_lists_again_from_the_first_page(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    api.put_objects("resourceclaims", waiting_and_not(12, every=3), check_each=False)
    agents = Agents()
    second = api.hold_next("GET", r"/v1/resourceclaims\?.*continue=")
    async with controlling(kube, agents, page_size=5) as controller:
        await second.arrived.wait()
        api.put_object("resourceclaims", claim("c-00010x", "gpu-0"))  # made meanwhile
        api.compact()  # the first page's version is forgotten: its token expires
        second.release.set()
        await until(lambda: controller.counters.answers_written == 5, timeout_s=10.0)
        await until(lambda: not controller.owing)
    assert controller.counters.relists == 2  # at once, not after a backoff
    assert controller.counters.follow_failures == 0
    assert controller.counters.list_pages == 1 + 3  # the page before, then three afresh
    assert sorted(name for _, name in agents.asks) == [
        "c-00000",
        "c-00003",
        "c-00006",
        "c-00009",
        "c-00010x",
    ]
