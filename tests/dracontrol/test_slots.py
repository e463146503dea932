"""A slow or hung node's agent holds only its own node's slots: many claims waiting for
it do not stall the answers of the other nodes, at most ``per_node_concurrency`` asks
are in flight to it, and the per-node slots leave nothing behind once no ask waits."""

from __future__ import annotations

import asyncio

import pytest

from agent.dracontrol.port import ShareAnswerValue
from agent.dracontrol.slots import NodeSlots
from agent.kubeapi.port import Obj
from agent.kubeapi.rest import RestKubeApi
from tests.dracontrol.helpers import Agents, claim, conditions, controlling, until
from tests.kubeworld.apiserver import FakeApiServer

HUNG = "node-hung"


class HungAgents(Agents):
    """The agent of ``HUNG`` answers only once ``release`` is set (a hung agent whose
    calls outlive their timeout); the others at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0

    async def answer(self, node: str, claim: Obj) -> list[ShareAnswerValue]:
        if node == HUNG:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await self.release.wait()
            finally:
                self.in_flight -= 1
        return await super().answer(node, claim)


async def test_a_hung_nodes_claims_do_not_stall_the_other_nodes_answers(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    agents = HungAgents()
    async with controlling(kube, agents) as controller:  # 32 API slots, 4 per node
        for i in range(40):
            api.put_object("resourceclaims", claim(f"h-{i:02d}", "gpu-0", node=HUNG))
        await until(lambda: agents.in_flight >= 4)
        api.put_object("resourceclaims", claim("c", "gpu-0", node="node-a"))
        await until(lambda: bool(conditions(api, "c")), timeout_s=3.0)
        assert agents.most_in_flight == 4  # the hung node's slots, no more
        assert controller.node_slots.busy(HUNG) == 40  # the others wait, holding nothing
        agents.release.set()
        await until(lambda: not controller.owing, timeout_s=15.0)
        assert all(conditions(api, f"h-{i:02d}") for i in range(40))
    assert len(controller.node_slots) == 0  # nothing kept for nodes no ask waits for


async def test_node_slots_bound_each_node_and_are_dropped_when_unused() -> None:
    slots = NodeSlots(2)
    running: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}
    gate = asyncio.Event()

    async def ask(node: str) -> None:
        async with slots.held(node):
            running[node] += 1
            most[node] = max(most[node], running[node])
            await gate.wait()
            running[node] -= 1

    tasks = [asyncio.create_task(ask(n)) for n in "aaaaab"]
    await until(lambda: running == {"a": 2, "b": 1})
    assert (slots.busy("a"), slots.busy("b"), len(slots)) == (5, 1, 2)
    gate.set()
    await asyncio.gather(*tasks)
    assert most == {"a": 2, "b": 1} and len(slots) == 0 and slots.busy("a") == 0


async def test_a_node_slot_is_given_back_when_its_ask_fails_or_is_cancelled() -> None:
    slots = NodeSlots(1)
    with pytest.raises(RuntimeError):
        async with slots.held("a"):
            raise RuntimeError("the ask failed")
    hold = asyncio.Event()

    async def holding() -> None:
        async with slots.held("a"):
            await hold.wait()

    first = asyncio.create_task(holding())
    waiting = asyncio.create_task(holding())
    await until(lambda: slots.busy("a") == 2)
    waiting.cancel()  # cancelled while it waits for the slot
    first.cancel()  # cancelled while it holds it
    await asyncio.gather(first, waiting, return_exceptions=True)
    assert len(slots) == 0
    async with slots.held("a"):  # free again
        assert slots.busy("a") == 1
    with pytest.raises(ValueError):
        NodeSlots(0)
