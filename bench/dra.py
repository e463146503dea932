"""The DRA driver at scale: pods with ResourceClaims created, scheduled, prepared, run and
deleted on a loopback cluster (tests/kubeworld/cluster/dra.py) whose nodes' agents are the
DRA driver ``gpushare.io``.

Every node is a real ``gpushare serve --sim`` process (4 simulated 80 GiB GPUs) with
``dra.enabled``: it publishes its ResourceSlice, answers the binding condition of each
share allocated to it, and serves NodePrepareResources / NodeUnprepareResources to its
kubelet, the kubelet stand-in (the real gRPC APIs, the runtime's CDI injection into fake
containers). The scheduler stand-in plays kube-scheduler (DynamicResources, consumable
capacity, binding conditions, the extended-resource mapping) and the resourceclaim
controller; the API server is the stand-in ``FakeApiServer``.

Most pods use a ResourceClaimTemplate of one of several sizes (memory and threads); some
ask only for ``gpushare.io/gpu: 1`` in their limits (the DeviceClass's extended resource,
the default share). Pods are created while at most ``--window`` of them wait unbound (a
closed loop), run a random time once Running, then go one of two ways: a graceful delete
(the pod stays, marked, until its kubelet has stopped it and unprepared its claim) or a
force delete (gone at once: the Unprepare and the claim's deletion race).

Measured in the same run:

- ``pods`` created, ``bound``, ``running``; ``prepared`` / ``unprepared``: claims that
  NodePrepareResources answered with devices / NodeUnprepareResources answered without
  error (one claim per pod); ``pods_per_s``: pods Running over the time from the first
  create to the last one Running;
- ``leases_leaked``: live leases on any agent after every pod is gone and the claim
  reconcile (``--reconcile-s``) has run twice;
- ``wrong_injections``: Running containers whose ``GPUSHARE_LEASE_ID`` is not the live
  lease of their own claim (request id ``dra:<claim uid>:...``, lease ``pod`` the pod), or
  whose ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (or
  lease) differ from the claim's ``consumedCapacity``; each pod is checked once, against its
  node's ledger read while it runs (reads coalesced per node);
- ``overcommit``: ledger reads (every ``--sample-s`` and those checks) in which a device's
  committed memory plus a context overhead per lease and the reserve passed its memory, its
  thread percentages the thread budget, or its leases the ``clients`` capacity; and samples
  of the API's claims whose ``consumedCapacity`` summed per device passed the capacity its
  slice publishes;
- ``lost``: pods never bound within ``--bind-deadline-s``, bound but never Running, whose
  lease still lived at the end, or whose claim was still in the API server at the end;
- ``agent_cpu_ms_per_prepare_unprepare``: the agents' CPU (user + system, every agent
  process) from the first create to the last pod gone, over the prepare+unprepare pairs:
  everything the agents did for those pods (binding answers, every agent following every
  claim, reconcile passes, slice writes, the harness's ledger reads);
  ``agent_cpu_ms_per_noop``: their CPU per ``Ping`` (unix socket) in a phase of its own
  after; ``..._quiet``: per Unprepare+Prepare of claims already allocated, called straight
  on their nodes' plugins while nothing else runs (before the churn; each Prepare there is
  a claim's re-Prepare: a new lease under a new request id of the same share);
  ``agent_cpu_idle_ms_per_s``: all agents together while nothing is asked of them (part of
  each figure above; ``cpu_ratio_idle_subtracted`` takes it out of both sides);
- ``slice_writes_per_node_per_s_max``: the most writes of one node's ResourceSlice within
  any 1 s window during the churn (stamped as the API server stores them), beside their
  mean rate, the shortest gap between two, and which device fields the writes changed.

Harness shortcuts: pods are written straight into the API server's store; the containers
are fake; the API server, the scheduler stand-in, the kubelets and this harness share one
process and event loop, beside the agents, on the same cores.

With ``--scale`` (bench/drascale.py): the same pods per node at 4, 16 and 48 nodes, each
cluster with 20,000 ResourceClaims of other nodes standing in the API server, to see what
grows with the cluster: each agent's CPU per pod on its own node (its idle rate
subtracted), the bytes of other nodes' claims each agent read (counted by the API
stand-in per agent token, every connection), an agent's memory with those claims against
without, NodePrepareResources p99, Prepare+Unprepare on a quiet node over a no-op RPC, and
the correctness figures of every run.

    python bench/dra.py            # 16 nodes, 2,000 pods (several minutes)
    python bench/dra.py --small    # 4 nodes, 200 pods (the test's size)
    python bench/dra.py --scale    # 4, 16 and 48 nodes, 40 pods a node (within 15 minutes)

Progress goes to stderr; prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.admission.policy import Rules  # noqa: E402
from agent.client import AgentClient  # noqa: E402
from agent.config.dra import DraSettings  # noqa: E402
from bench.cpu import cpu_by_part, ms_per  # noqa: E402
from bench.dra_checks import (  # noqa: E402
    SliceWrites,
    api_problems,
    claim_name_of,
    injection_problem,
    ledger_problems,
    slice_figures,
)
from bench.dra_figures import Measured, idle_ms_per_s, noop_phase, part_of, quiet_phase, summarize  # noqa: E402
from bench.dra_plan import (  # noqa: E402
    FULL,
    NAMESPACE,
    POLL_S,
    QUIET_AGENT,
    SMALL,
    TEMPLATES,
    PodPlan,
    plan_pods,
    say,
)
from tests.helpers import short_dir  # noqa: E402
from tests.kubeworld.apiserver import (  # noqa: E402
    ApiError,
    FakeApiServer,
    Obj,
)
from tests.kubeworld.cluster.dra import (  # noqa: E402
    DraCluster,
    PodRunner,
    claim_template,
    dra_cluster,
)

# -- the run -----------------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    cluster: DraCluster
    plans: list[PodPlan]
    clients: dict[str, AgentClient] = field(default_factory=dict)
    rules: Rules = field(default_factory=Rules)
    clients_per_device: int = DraSettings().clients_per_device
    created: int = 0
    settled: int = 0  # bound, or given up on
    bound: int = 0
    running: int = 0
    gone: int = 0
    first_create: float = 0.0
    last_running: float = 0.0
    wrong: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    overcommit_ledger: list[str] = field(default_factory=list)
    overcommit_api: list[str] = field(default_factory=list)
    ledger_reads: int = 0
    api_samples: int = 0
    pending: dict[str, list[PodPlan]] = field(default_factory=dict)  # node -> to check
    due: dict[str, asyncio.Event] = field(default_factory=dict)  # node -> read it now
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def server(self) -> FakeApiServer:
        return self.cluster.api_server

    @property
    def runner(self) -> PodRunner:
        return self.cluster.running

    # -- the pods ----------------------------------------------------------------------------

    async def creator(self, spawn: Callable[[Awaitable[None]], None]) -> None:
        self.first_create = time.monotonic()
        pace_per_s = getattr(self.args, "create_per_s", 0.0)  # --scale's steady rate
        for index, plan in enumerate(self.plans):
            if pace_per_s > 0:
                due = self.first_create + index / pace_per_s
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            while self.created - self.settled >= self.args.window:
                self.wake.clear()
                await self.wake.wait()
            stored = self.server.put_object("pods", plan.manifest())
            plan.uid, plan.created_at = stored["metadata"]["uid"], time.monotonic()
            self.created += 1
            spawn(self.lifecycle(plan))

    async def lifecycle(self, plan: PodPlan) -> None:
        if not await self.until_bound(plan):
            plan.outcome = "unbound"
            await self.end(plan, force=True)
            return
        if not await self.until_running(plan):
            await self.end(plan, force=True)
            return
        await self.verified(plan)
        await asyncio.sleep(max(0.0, plan.run_s - (time.monotonic() - plan.running_at)))
        await self.end(plan, force=plan.ending == "force")

    async def until_bound(self, plan: PodPlan) -> bool:
        deadline = plan.created_at + self.args.bind_deadline_s
        assert self.cluster.scheduler is not None
        bound = self.cluster.scheduler.bound
        while (node := bound.get(f"{NAMESPACE}/{plan.name}")) is None:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(POLL_S)
        self.settled += 1
        self.wake.set()
        if node is None:
            return False
        plan.node = node
        self.bound += 1
        return True

    async def until_running(self, plan: PodPlan) -> bool:
        deadline = time.monotonic() + self.args.run_deadline_s
        while True:
            pod = self.server.objects["pods"].get(plan.key) or {}
            if (pod.get("status") or {}).get("phase") == "Running":
                break
            if time.monotonic() > deadline:
                why = self.runner.errors.get(plan.key, "never started")
                plan.outcome = f"not run: {why}"[:300]
                return False
            await asyncio.sleep(POLL_S)
        plan.running_at = self.last_running = time.monotonic()
        plan.claim = claim_name_of(pod)
        self.running += 1
        return True

    async def verified(self, plan: PodPlan) -> None:
        """Until its node's ledger was read while it runs, and its container checked."""
        self.pending.setdefault(plan.node, []).append(plan)
        self.due[plan.node].set()
        try:
            await asyncio.wait_for(plan.checked.wait(), self.args.run_deadline_s)
        except TimeoutError:
            self.unverified.append(plan.name)

    async def end(self, plan: PodPlan, *, force: bool) -> None:
        with contextlib.suppress(ApiError):
            self.server.delete_pod(NAMESPACE, plan.name, force=force)
        if plan.ending == "graceful":  # the kubelet's last word: it has stopped the pod
            if plan.node and not await self.until(lambda: plan.uid in self.runner.stopped):
                plan.outcome = plan.outcome or "never stopped by its kubelet"
            with contextlib.suppress(ApiError):
                self.server.patch_pod(NAMESPACE, plan.name, {"metadata": {"finalizers": None}})
        claims = self.server.objects["resourceclaims"]
        if not await self.until(
            lambda: (
                plan.key not in self.server.objects["pods"]
                and (NAMESPACE, plan.claim) not in claims
            )
        ):
            plan.outcome = plan.outcome or "pod or claim never gone"
        self.gone += 1

    async def until(self, predicate: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + self.args.run_deadline_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    # -- beside the pods ---------------------------------------------------------------------

    async def reader(self, node: str) -> None:
        """Its node's ledger, every ``--sample-s`` and whenever a pod waits for its check."""
        client, due = self.clients[node], self.due[node]
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(due.wait(), self.args.sample_s)
            due.clear()
            waiting, self.pending[node] = self.pending.get(node, []), []
            try:
                answer = await client.get_node(ledger_only=True)
            except grpc.aio.AioRpcError:
                self.pending[node] = waiting + self.pending[node]
                await asyncio.sleep(0.2)
                continue
            self.ledger_reads += 1
            self.overcommit_ledger += ledger_problems(
                node, answer, self.rules, self.clients_per_device
            )
            for plan in waiting:
                self.check(plan, list(answer.leases))
            await asyncio.sleep(self.args.read_gap_s)  # checks waiting meanwhile go together

    def check(self, plan: PodPlan, leases: list[Any]) -> None:
        claim = self.server.objects["resourceclaims"].get((NAMESPACE, plan.claim))
        env = self.runner.env(NAMESPACE, plan.name)
        problem = injection_problem(claim, env, leases, f"{NAMESPACE}/{plan.name}")
        if problem:
            self.wrong.append(f"{plan.name} on {plan.node}: {problem}")
        plan.checked.set()

    async def api_sampler(self) -> None:
        while not self.stop.is_set():
            self.overcommit_api += api_problems(self.server)
            self.api_samples += 1
            await asyncio.sleep(self.args.sample_s)

    async def progress(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            await asyncio.sleep(self.args.progress_s)
            print(
                f"[{time.monotonic() - started:6.1f} s] created {self.created} bound "
                f"{self.bound} running {self.running} gone {self.gone}, ledger reads "
                f"{self.ledger_reads}, load {os.getloadavg()[0]:.2f}",
                file=sys.stderr,
                flush=True,
            )

    async def live_leases(self) -> list[tuple[str, str, str]]:
        """(node, pod, lease id) of every live lease on every agent."""
        found = []
        for name, client in self.clients.items():
            answer = await client.get_node(ledger_only=True)
            found += [(name, x.pod, x.lease_id) for x in answer.leases]
        return found


def agent_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        **QUIET_AGENT,
        "dra.reconcile_interval_s": args.reconcile_s,
        "dra.slice_min_interval_s": args.slice_min_interval_s,
    }


async def run(args: argparse.Namespace, root: Path) -> Obj:
    rng = random.Random(args.seed)
    plans = plan_pods(args, rng)
    load_before = os.getloadavg()
    async with dra_cluster(
        root,
        nodes=args.nodes,
        settings=agent_settings(args),
        start_timeout_s=30.0 * args.nodes,  # 16 agents starting at once on 2 cores
    ) as cluster:
        try:
            bench = Bench(args, cluster, plans)
            measured = await _measure(bench, rng)
        finally:
            _keep_logs(args, cluster)
        return summarize(bench, measured, load_before)


async def _measure(bench: Bench, rng: random.Random) -> Measured:
    args, cluster = bench.args, bench.cluster
    assert cluster.scheduler is not None
    cluster.scheduler.rng = random.Random(rng.random())
    for name, (memory, threads) in TEMPLATES.items():
        await cluster.apply(claim_template(name, NAMESPACE, memory=memory, threads=threads))
    measured = Measured()
    async with contextlib.AsyncExitStack() as stack:
        for name, node in cluster.nodes.items():
            client = AgentClient(f"unix://{node.socket}", attempts=1, timeout_s=30)
            bench.clients[name] = await stack.enter_async_context(client)
            bench.due[name] = asyncio.Event()
        say(f"{args.nodes} nodes up; {args.pods} pods to go")
        measured.quiet = await quiet_phase(bench, args.quiet_pods, args.quiet_cycles)
        say(f"quiet phase: {measured.quiet}")
        await _churn(bench, measured)
        say("churn done; waiting for the claim reconcile to pass twice")
        await asyncio.sleep(2 * args.reconcile_s + 1.0)
        measured.leases = await bench.live_leases()
        measured.left_claims = bench.server.objects("resourceclaims", NAMESPACE)
        measured.idle_ms_per_s = await idle_ms_per_s(args.idle_s)
        measured.noop = await noop_phase(bench.clients, args.noop_calls, args.noop_callers)
        say(f"no-op phase: {measured.noop}")
    return measured


async def _churn(bench: Bench, measured: Measured) -> None:
    """The pods, from the first create to the last one gone, with the samplers beside."""
    writes = SliceWrites(bench.server)
    beside = [asyncio.create_task(bench.reader(n)) for n in bench.clients]
    beside += [asyncio.create_task(bench.api_sampler()), asyncio.create_task(bench.progress())]
    tasks: set[asyncio.Future[None]] = set()

    def spawn(coro: Awaitable[None]) -> None:
        tasks.add(asyncio.ensure_future(coro))

    try:
        cpu_before = cpu_by_part(part_of)
        await bench.creator(spawn)
        await asyncio.gather(*tasks)
        measured.churn_end = time.monotonic()
        cpu_after = cpu_by_part(part_of)
        measured.churn_cpu = ms_per(cpu_before, cpu_after, len(bench.plans))
        measured.churn_agents_s = cpu_after["agents"] - cpu_before["agents"]
    finally:
        bench.stop.set()
        for task in beside:
            task.cancel()
        await asyncio.gather(*beside, return_exceptions=True)
        writes.close()
    span_s = measured.churn_end - bench.first_create
    during = writes.between(bench.first_create, measured.churn_end)
    measured.slices = slice_figures(during, sorted(bench.clients), span_s)
    measured.slices["slice_writes_changing"] = dict(writes.changed.most_common())


def _keep_logs(args: argparse.Namespace, cluster: DraCluster) -> None:
    if not args.keep_logs:
        return
    target = Path(args.keep_logs)
    target.mkdir(parents=True, exist_ok=True)
    for name, node in cluster.nodes.items():
        log_file = node.root / "agent.log"
        if log_file.exists():
            shutil.copyfile(log_file, target / f"{name}.log")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _pair(text: str) -> tuple[float, float]:
    low, high = (float(x) for x in text.split(","))
    return low, high


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--small", action="store_true", help="4 nodes, 200 pods")
    add("--nodes", type=int, default=None, help="simulated nodes (16)")
    add("--pods", type=int, default=None, help="pods created (2000)")
    add("--window", type=int, default=64, help="pods waiting unbound at most (64)")
    add("--seed", type=int, default=1)
    add("--run-s", type=_pair, default=(0.2, 2.0), help="pod run time LOW,HIGH s (0.2,2)")
    add("--extended-share", type=float, default=0.2, help="pods with the extended resource")
    add("--bind-deadline-s", type=float, default=120.0)
    add("--run-deadline-s", type=float, default=60.0, help="bound to Running, and each wait")
    add("--sample-s", type=float, default=1.0, help="between ledger and API samples (1)")
    add("--read-gap-s", type=float, default=0.1, help="least time between two ledger reads")
    add("--reconcile-s", type=float, default=1.0, help="the agents' dra.reconcile_interval_s")
    add(
        "--slice-min-interval-s",
        type=float,
        default=DraSettings().slice_min_interval_s,
        help="the agents' dra.slice_min_interval_s (its default)",
    )
    add("--quiet-pods", type=int, default=32, help="claims of the quiet phase (32)")
    add("--quiet-cycles", type=int, default=2, help="Unprepare+Prepare per claim (2)")
    add("--noop-calls", type=int, default=1000, help="Pings per agent (1000)")
    add("--noop-callers", type=int, default=4, help="callers per agent (4)")
    add(
        "--idle-s",
        type=float,
        default=None,
        help="idle window for the agents' own CPU (3 s; --scale: 10 s)",
    )
    add("--progress-s", type=float, default=5.0)
    add("--keep-logs", default="", help="copy the agents' logs into this directory")
    add("--json-only", action="store_true", help="print the JSON line only")
    add("--scale", action="store_true", help="the scale run (bench/drascale.py)")
    add("--scale-nodes", type=_ints, default=(4, 16, 48), help="--scale: node counts (4,16,48)")
    add("--pods-per-node", type=int, default=40, help="--scale: pods per node (40)")
    add("--window-per-node", type=int, default=4, help="--scale: unbound pods per node (4)")
    add(
        "--pods-per-node-per-s",
        type=float,
        default=0.25,
        help="--scale: pods created a second per node, the same at every size (0.25; 0: as "
        "fast as the window lets)",
    )
    add("--foreign-claims", type=int, default=20000, help="--scale: other nodes' claims")
    add("--settle-s", type=float, default=5.0, help="--scale: before each memory reading")
    args = parser.parse_args(argv)
    size = SMALL if args.small else FULL
    args.nodes = args.nodes or size["nodes"]
    args.pods = args.pods or size["pods"]
    if args.idle_s is None:  # --scale subtracts its idle rates per agent: a longer window
        args.idle_s = 10.0 if args.scale else 3.0
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with short_dir() as root:
        if args.scale:
            from bench.drascale import scale_run

            result = asyncio.run(scale_run(args, root))
        else:
            result = asyncio.run(run(args, root))
    if not args.json_only:
        print(f"{'figure':<44} value", flush=True)
        for key, value in result.items():
            print(f"{key:<44} {value}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
