"""Work owed until done: one task a key; a newer copy owed during a try that settles is
tried too, not dropped with the debt."""

from __future__ import annotations

import asyncio

from agent.aio.owed import Debt, Owed


async def test_a_copy_owed_during_a_try_that_settles_is_tried_too() -> None:
    seen: list[str] = []
    holding = asyncio.Event()
    release = asyncio.Event()

    async def attempt(debt: Debt[str]) -> bool:
        seen.append(debt.item)
        if debt.item == "old":
            holding.set()
            await release.wait()  # settles: the old copy no longer waits
        return True

    owed = Owed(attempt, first_s=10.0, max_s=10.0, name=lambda item: item)
    owed.owe("claim", "old")
    await holding.wait()
    owed.owe("claim", "new")  # the watch: allocated again, waiting again
    release.set()
    async with asyncio.timeout(5):
        while "claim" in owed:
            await asyncio.sleep(0.01)
    assert seen == ["old", "new"]
    await owed.aclose()


async def test_a_failed_try_waits_its_back_off_and_one_task_serves_a_key() -> None:
    tries: list[str] = []

    async def attempt(debt: Debt[str]) -> bool:
        tries.append(debt.item)
        return len(tries) > 1

    owed = Owed(attempt, first_s=0.05, max_s=0.05, name=lambda item: item)
    owed.owe("claim", "a")
    owed.owe("claim", "a")
    async with asyncio.timeout(5):
        while "claim" in owed:
            await asyncio.sleep(0.01)
    assert len(tries) == 2
    await owed.aclose()
