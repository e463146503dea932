"""WatchEvents streams for bench/admission.py, in a process of their own, so that reading
them does not share an event loop (or the GIL) with the caller being timed.

    python bench/watchers.py TARGET --count N --since SEQ [--until SEQ] --deadline-s S
                             [--rpc batches|events]

Opens COUNT WatchEventBatches (or, with --rpc events, WatchEvents) streams (since_seq=SEQ)
with the bench token, PER_CONNECTION to a TCP connection of their own, and prints
"started" before the first one is opened and "ready" once every stream has its initial
metadata. Each stream reads every event and
checks that the numbers follow one another. A stream stops at the event UNTIL, given on the
command line or, if not, as one line on stdin (written when the load is over), or at the
deadline. A stream ended with RESOURCE_EXHAUSTED (fell too far behind) resumes after the
last event it got, and is counted. The last line printed is one JSON object.

`WatcherProcess` starts and talks to such a process from the benchmark's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import TOKEN  # noqa: E402

from agent.api.proto import agent_pb2 as pb  # noqa: E402
from agent.api.proto import agent_pb2_grpc as pb_grpc  # noqa: E402

PER_CONNECTION = 25
MAX_WATCHERS = 2000
METADATA = (("authorization", f"Bearer {TOKEN}"),)


@dataclass
class Watcher:
    last: int
    events: int = 0
    gaps: int = 0
    exhausted: int = 0
    first_seq: int = 0
    done_at: float | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class Run:
    until: int | None
    deadline: float
    started: float = field(default_factory=time.monotonic)
    until_at: float | None = None
    settled: int = 0  # streams that got their initial metadata, or failed before it
    count: int = 0
    batches: bool = False  # WatchEventBatches instead of WatchEvents
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def settle(self) -> None:
        self.settled += 1
        if self.settled == self.count:
            self.ready.set()

    def reached(self, watcher: Watcher) -> bool:
        if self.until is None or watcher.last < self.until:
            return False
        if watcher.done_at is None:
            watcher.done_at = time.monotonic()
        return True


async def follow(stub: pb_grpc.AgentStub, watcher: Watcher, run: Run) -> None:
    try:
        await follow_streams(stub, watcher, run)
    finally:
        if watcher.first_seq == 0:
            run.settle()  # failed before its first metadata


async def follow_streams(stub: pb_grpc.AgentStub, watcher: Watcher, run: Run) -> None:
    while not run.reached(watcher):
        remaining = run.deadline - time.monotonic()
        if remaining <= 0:
            watcher.errors.append("deadline")
            return
        request = pb.WatchEventsRequest(since_seq=watcher.last)
        rpc = stub.WatchEventBatches if run.batches else stub.WatchEvents
        call = rpc(request, metadata=METADATA, timeout=remaining)
        try:
            metadata = dict(await call.initial_metadata() or ())
            start = int(metadata.get("gpushare-first-seq", watcher.last + 1))
            if watcher.first_seq == 0:  # below the oldest kept: starts there, not a loss
                watcher.first_seq = start
                watcher.last = max(watcher.last, start - 1)
                run.settle()
            async for message in call:
                for event in message.events if run.batches else (message,):
                    if event.seq != watcher.last + 1:
                        watcher.gaps += 1
                    watcher.last = event.seq
                    watcher.events += 1
                if run.reached(watcher):
                    return
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                watcher.exhausted += 1
                continue
            code = "deadline" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else exc.code()
            watcher.errors.append(f"{code}: {exc.details()}")
            return
        finally:
            call.cancel()
        if not run.reached(watcher):  # the server ended the stream without a status error
            watcher.errors.append("stream ended")
            return


async def read_until(run: Run, watchers: list[Watcher], tasks: list[asyncio.Task[None]]) -> None:
    """The seq to stop at, from stdin; streams already there stop now."""
    line = await asyncio.to_thread(sys.stdin.readline)
    if not line.strip():  # stdin closed: the benchmark gave up
        return
    run.until, run.until_at = int(line), time.monotonic()
    for watcher, task in zip(watchers, tasks, strict=True):
        if run.reached(watcher):
            task.cancel()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    count = min(args.count, MAX_WATCHERS)
    run = Run(
        until=args.until,
        deadline=time.monotonic() + args.deadline_s,
        count=count,
        batches=args.rpc == "batches",
    )
    watchers = [Watcher(last=args.since) for _ in range(count)]
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own
    channels = [
        grpc.aio.insecure_channel(args.target, options=options)
        for _ in range(-(-count // PER_CONNECTION))
    ]
    print("started", flush=True)
    run.started = time.monotonic()
    tasks = [
        asyncio.create_task(follow(pb_grpc.AgentStub(channels[i // PER_CONNECTION]), w, run))
        for i, w in enumerate(watchers)
    ]
    readiness = asyncio.create_task(run.ready.wait())
    done, _ = await asyncio.wait([readiness], timeout=max(0.0, run.deadline - time.monotonic()))
    print("ready" if done else "not ready", flush=True)
    ready_s = time.monotonic() - run.started
    stopper = asyncio.create_task(read_until(run, watchers, tasks)) if run.until is None else None
    await asyncio.wait(tasks)
    if stopper is not None:
        stopper.cancel()
    for watcher, task in zip(watchers, tasks, strict=True):
        if not task.cancelled() and task.exception() is not None:
            watcher.errors.append(repr(task.exception()))
    for channel in channels:
        await channel.close(None)
    done_at = [w.done_at for w in watchers if w.done_at is not None]
    since_until = run.until_at if run.until_at is not None else run.started
    return {
        "watchers": count,
        "ready_s": ready_s,
        "until": run.until,
        "reached": len(done_at),
        "done_s": max(done_at) - run.started if len(done_at) == count else None,
        "done_s_after_until": max(done_at) - since_until if len(done_at) == count else None,
        "events": sum(w.events for w in watchers),
        "first_seq": min(w.first_seq for w in watchers) if watchers else 0,
        "gaps": sum(w.gaps for w in watchers),
        "resource_exhausted": sum(w.exhausted for w in watchers),
        "errors": sum(len(w.errors) for w in watchers),
        "error_samples": sorted({e for w in watchers for e in w.errors})[:5],
    }


class WatcherProcess:
    """bench/watchers.py as a child process of the benchmark."""

    def __init__(
        self, target: str, count: int, since: int, deadline_s: float, rpc: str = "batches"
    ) -> None:
        self.args = (target, "--count", str(count), "--since", str(since), "--rpc", rpc)
        self.deadline_s = deadline_s
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, until: int | None = None) -> None:
        extra = ("--until", str(until)) if until is not None else ()
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, __file__, *self.args, *extra, "--deadline-s", str(self.deadline_s),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip

    async def line(self) -> str:
        assert self.process is not None and self.process.stdout is not None
        return (await self.process.stdout.readline()).decode().strip()

    async def wait_for(self, word: str) -> None:
        got = await asyncio.wait_for(self.line(), timeout=self.deadline_s)
        if got != word:
            raise SystemExit(f"watchers: expected {word!r}, got {got!r}")

    async def stop_at(self, seq: int) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(f"{seq}\n".encode())
        await self.process.stdin.drain()

    async def result(self) -> dict[str, Any]:
        """The JSON line; the process is killed if it outlives its deadline by 30 s."""
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.close()  # EOF: a process still waiting for a stop line stops
        try:
            last = ""
            async with asyncio.timeout(self.deadline_s + 30):
                while line := await self.line():
                    last = line
                await self.process.wait()
        finally:
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
        if self.process.returncode != 0 or not last.startswith("{"):
            raise SystemExit(f"watchers exited {self.process.returncode}: {last!r}")
        return dict(json.loads(last))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--since", type=int, required=True)
    parser.add_argument("--until", type=int, default=None)
    parser.add_argument("--deadline-s", type=float, default=120.0)
    parser.add_argument("--rpc", choices=("events", "batches"), default="batches")
    print(json.dumps(asyncio.run(main_async(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
