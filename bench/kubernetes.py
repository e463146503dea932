"""Kubernetes end to end at scale: pods created, bound, run and deleted on a cluster on
loopback (tests/kubeworld/cluster/), with the real agents deciding.

Every node is a real ``gpushare serve --sim`` process (4 simulated 80 GiB GPUs) on its own
loopback address, its device plugin registered with a test kubelet that speaks the real
kubelet gRPC APIs; the cluster side is the real one, ``gpushare kube serve`` (extender,
binder, lease controller, node-state publisher); kube-scheduler is played by the scheduler
stand-in (filter, prioritize, bind through the extender); the API server is the stand-in
``FakeApiServer``.

Each pod asks for a random share (memory and thread annotations, a priority); a tenth are
in gangs of four. Pods are created while at most ``--window`` of them wait unbound (a
closed loop: the rate is what the cluster takes), bound by the scheduler stand-in through
the extender, allocated by their node's kubelet (the agent's device plugin answers
Allocate), reported Running, run for a random time, then end one of three ways: the
kubelet reports Succeeded and the pod is deleted, a graceful delete, or a force delete.
The lease controller releases each lease and removes the finalizer.

Measured in the same run:

- ``pods`` created, ``bound`` (got a node), ``pods_per_s``: bound pods over the time from
  the first create to the last bind;
- ``bind_p50_ms`` / ``bind_p99_ms``: the extender's ``/bind`` as the scheduler sees it
  (HTTP round trip, the per-node hold behind the previous pod's Allocate, the agent's
  Admit or Reserve/Commit, the lease annotation and the Binding), successful binds only;
- ``admit_p50_ms``: ``Admit`` called straight on the agents (admit + release pairs, round
  robin over the nodes, all through the run), the agent's own decision under the same load;
- ``leases_leaked``: live leases on any agent after every pod is gone and the controller's
  grace and reconcile interval have passed twice;
- ``wrong_lease_injections``: containers whose Allocate environment carries another lease
  id than their pod's ``gpushare.io/lease`` annotation, or a memory limit or thread
  percentage other than the pod's own annotations;
- ``overcommit``: samples (every agent's ``GetNode`` every ``--sample-s``) in which a
  device's committed memory plus context overhead and reserve passed its memory, its thread
  percentages passed the thread budget, or its leases the client limit;
- ``cpu_ms_per_pod``: CPU (user + system) from the first create to the last pod gone, per
  pod created, by part (``agents``, ``cluster_side``, ``scheduler``, ``harness``: this
  process with its stand-ins, and the parts run inline) and in ``all``; ``cores_busy``:
  that CPU over the same time (the machine's cores bound the rate when it nears them);
- ``lost``: pods never bound within ``--bind-deadline-s`` (every pod fits an empty
  device), bound but never Running, whose lease was still live at the end, or still in the
  API server at the end (the finalizer never removed).

With ``--faults SHARE`` (:mod:`bench.faults`), the stand-in API server answers that share
of Bindings, pod patches (the finalizer's removal), pod watches (each ended every
``--end-watches-s``, so they connect again) and reads of a pod with a 5xx or a timeout that
landed or did not, a 409, a 410 or a reset, and agents are SIGKILLed in the middle of
binds (``--kill-agents``) and started again; ``gpushare kube serve`` gives an API request up
after ``--api-timeout-s``. Reported beside the figures above:

- ``running_without_lease``: pods the kubelet reported Running whose lease was not live on
  their node in two ledger samples in a row (a pod evicted by a guaranteed one aside);
- ``pods_never_started``: pods that were bound, exist, and never ran (the kubelet
  rejecting a pod bound while its agent was away is ``rejected_agent_away``: the pod is
  Failed, as a real kubelet leaves it, and its owner would make a new one);
- ``faults``: what was injected, by kind and answer, and the agents killed.

Harness shortcuts a real cluster does not have: pods are created, phased and deleted by
writes straight into the stand-in API server's store (the same events its watchers see;
``--webhook`` sends each pod through the webhook and an HTTP create instead); the kubelets
start no containers; the API server, the scheduler stand-in (``--scheduler process``: in a
process of its own) and the kubelets run in this one process, beside ``gpushare kube
serve`` (its own process; ``--cluster-side inline`` runs it here) and the agents, on the
same cores.

    python bench/kubernetes.py            # 16 nodes, 2,000 pods (a few minutes)
    python bench/kubernetes.py --small    # 4 nodes, 200 pods (the test's size)
    python bench/kubernetes.py --small --faults 0.1 --kill-agents 3

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
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.admission.policy import Rules  # noqa: E402
from agent.client import AgentClient, Priority  # noqa: E402
from agent.legacy.cluster.annotations import FINALIZER, LEASE_ANNOTATION, SCHEDULER_NAME  # noqa: E402
from bench.cpu import cpu_by_part, ms_per  # noqa: E402
from bench.faults import Chaos, end_watches, restart_later  # noqa: E402
from bench.kube_scheduler_proc import RemoteScheduler  # noqa: E402
from bench.kubernetes_checks import evicted_event, injection_problem, ledger_problems, why_stuck  # noqa: E402
from bench.kubernetes_figures import TimedScheduler, part_of, pct, summarize  # noqa: E402
from bench.kubernetes_plan import AGENT_ARGS, GIB, NAMESPACE, PodPlan, parse_args, plan_pods  # noqa: E402
from tests.helpers import short_dir  # noqa: E402
from tests.kubeworld.apiserver import ApiError, Obj  # noqa: E402
from tests.kubeworld.cluster.device_plugin import (  # noqa: E402
    SHARE,
    LoopbackCluster,
    eventually,
    loopback_cluster,
    wait_agent,
)
from tests.kubeworld.kubelet.device_plugin import AdmissionRejected  # noqa: E402


@dataclass
class Run:
    args: argparse.Namespace
    cluster: LoopbackCluster
    scheduler: Any  # TimedScheduler, or RemoteScheduler (the same figures)
    units: list[list[PodPlan]]
    by_uid: dict[str, PodPlan] = field(default_factory=dict)
    clients: dict[str, AgentClient] = field(default_factory=dict)
    admit_ms: list[float] = field(default_factory=list)
    admit_refused: int = 0
    # probe calls whose outcome is unknown: (agent, the Admit asked, its lease id if known)
    probe_unsettled: list[tuple[str, dict[str, object], str | None]] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    overcommit: list[str] = field(default_factory=list)
    samples: int = 0
    created: int = 0
    bound: int = 0
    running: int = 0
    finished: int = 0
    first_create: float = 0.0
    last_bind: float = 0.0
    cpu_ms_per_pod: dict[str, float] = field(default_factory=dict)  # by part, and "all"
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    rules: Rules = field(default_factory=Rules)
    chaos: Chaos | None = None
    stuck: list[str] = field(default_factory=list)  # pods bound but never allocated: why
    missing: Counter[str] = field(default_factory=Counter)  # pod -> samples in a row
    without_lease: set[str] = field(default_factory=set)  # pods seen running without one
    started_on: dict[str, list[PodPlan]] = field(default_factory=dict)  # node -> Running

    # -- what the harness is told ----------------------------------------------------------

    def on_bound(self, uid: str) -> None:
        plan = self.by_uid.get(uid)
        if plan is None or plan.bound.is_set():
            return
        plan.bound_at = self.last_bind = time.monotonic()
        self.bound += 1
        plan.bound.set()
        self.wake.set()

    def on_started(self, pod: Obj, phase: str) -> None:
        """The kubelet allocated the pod's containers: check what each was given."""
        meta = pod["metadata"]
        plan = self.by_uid.get(meta["uid"])
        if plan is None:
            return
        plan.phase = phase
        if phase == "Running":
            self.running += 1
        kubelets = self.cluster.kubelets
        assert kubelets is not None
        lease = (meta.get("annotations") or {}).get(LEASE_ANNOTATION, "")
        plan.node, plan.lease_id = (pod.get("spec") or {}).get("nodeName", ""), lease
        if phase == "Running":
            self.started_on.setdefault(plan.node, []).append(plan)
        outcome = kubelets.got.get((meta["namespace"], meta["name"], "main"))
        if outcome is not None and isinstance(outcome.error, AdmissionRejected):
            plan.rejected = True  # its agent was away: the pod is Failed, as it should be
        if outcome is not None and outcome.failed_at in ("PreStartContainer", "CreateContainer"):
            # the node's PodResources check (or the NRI plugin) found a mismatch: the
            # container never starts
            self.refused.append(f"{plan.name}: {outcome.error}")
        elif outcome is not None and outcome.response is not None:
            env = kubelets.env(meta["namespace"], meta["name"], "main")
            problem = injection_problem(plan, lease, env)
            if problem is not None:
                self.wrong.append(problem)
        plan.started.set()

    # -- the pods --------------------------------------------------------------------------

    async def create(self, plan: PodPlan) -> None:
        pod = plan.manifest()
        if self.args.webhook:
            stored = await self.cluster.apply(pod)
        else:  # as the webhook's mutation leaves it, written into the store
            stored = self.cluster.api_server.create_pod(
                plan.name,
                NAMESPACE,
                annotations=pod["metadata"]["annotations"],
                limits={SHARE: 1},
                scheduler_name=SCHEDULER_NAME,
                finalizers=[FINALIZER],
                run_as_user=1000,
            )
        plan.uid = stored["metadata"]["uid"]
        plan.created_at = time.monotonic()
        self.by_uid[plan.uid] = plan
        self.created += 1

    async def creator(self, spawn: Any) -> None:
        self.first_create = time.monotonic()
        for unit in self.units:
            while self.created - self.bound >= self.args.window:
                self.wake.clear()
                await self.wake.wait()
            for plan in unit:
                await self.create(plan)
                spawn(self.lifecycle(plan))

    async def lifecycle(self, plan: PodPlan) -> None:
        api = self.cluster.api_server
        try:
            await asyncio.wait_for(plan.bound.wait(), self.args.bind_deadline_s)
        except TimeoutError:
            plan.outcome = "unbound"
            api.delete_pod(NAMESPACE, plan.name, force=True)
            await self.gone(plan)
            return
        try:
            await asyncio.wait_for(plan.started.wait(), self.args.bind_deadline_s)
        except TimeoutError:
            plan.phase = "never allocated"
            self.stuck.append(why_stuck(self.cluster, plan))
        if plan.phase != "Running":
            if await self.lease_evicted(plan, wait_s=10.0):
                await self.gone(plan)  # deleted by the controller: its owner would place it again
                return
            if not plan.rejected:
                plan.outcome = f"not run ({plan.phase})"
            plan.closing = True  # a pod Failed at admission: its owner would make a new one
            api.delete_pod(NAMESPACE, plan.name, force=True)
            await self.gone(plan)
            return
        await asyncio.sleep(plan.run_s)
        plan.closing = True
        if await self.lease_evicted(plan, wait_s=0.0):
            await self.gone(plan)
            return
        with contextlib.suppress(ApiError):  # evicted meanwhile: gone already
            if plan.ending == "succeeded":  # the kubelet's status, then the pod's cleanup
                api.set_pod_phase(NAMESPACE, plan.name, "Succeeded")
                await asyncio.sleep(random.uniform(0.0, 0.3))
                api.delete_pod(NAMESPACE, plan.name)
            else:
                api.delete_pod(NAMESPACE, plan.name, force=plan.ending == "force-deleted")
        await self.gone(plan)

    async def lease_evicted(self, plan: PodPlan, *, wait_s: float) -> bool:
        """Whether the lease controller deleted the pod because its agent evicted its
        lease (a guaranteed pod preempted it): an event LeaseEvicted on it."""
        deadline = time.monotonic() + wait_s
        while True:
            if evicted_event(self.cluster, plan):
                plan.evicted = True
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.2)

    async def gone(self, plan: PodPlan) -> None:
        """Until the pod is out of the API server (its finalizer removed)."""
        pods = self.cluster.api_server.objects["pods"]
        deadline = time.monotonic() + self.args.bind_deadline_s
        while (NAMESPACE, plan.name) in pods:
            if time.monotonic() > deadline:
                plan.outcome = plan.outcome or "stuck with the finalizer"
                return
            await asyncio.sleep(0.05)
        self.finished += 1

    # -- beside the pods -------------------------------------------------------------------

    async def admit_probe(self) -> None:
        """Admit + release straight on the agents, round robin, through the run. A call
        whose outcome is unknown (an agent killed under it, a deadline) is settled later, as
        a client must: the Admit asked again with its request id (the agent answers with the
        lease it made, if it made one), the Release sent again until it is sure."""
        names = sorted(self.clients)
        turn = 0
        while not self.stop.is_set():
            await self.settle_probe()
            name = names[turn % len(names)]
            turn += 1
            ask = {
                "request_id": f"probe-{uuid.uuid4().hex}",
                "tenant": NAMESPACE,
                "trust_domain": NAMESPACE,
                "priority": Priority.BEST_EFFORT,
                "memory_bytes": 1 * GIB,
                "thread_pct": 5.0,
            }
            started = time.perf_counter()
            try:
                answer = await self.clients[name].admit(**ask)
            except grpc.aio.AioRpcError:  # not a sample; it may have landed: settle it
                self.probe_unsettled.append((name, ask, None))
                await asyncio.sleep(self.args.probe_s)
                continue
            self.admit_ms.append(1e3 * (time.perf_counter() - started))
            if answer.decision.admitted:
                await self._probe_release(name, ask, answer.lease.lease_id)
            else:
                self.admit_refused += 1
            await asyncio.sleep(self.args.probe_s)

    async def _probe_release(self, name: str, ask: dict[str, object], lease_id: str) -> None:
        try:
            await self.clients[name].release(lease_id)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.NOT_FOUND:
                self.probe_unsettled.append((name, ask, lease_id))

    async def settle_probe(self) -> None:
        """Settle the probe's calls whose outcome was unknown (see ``admit_probe``)."""
        unsettled, self.probe_unsettled = self.probe_unsettled, []
        for name, ask, lease_id in unsettled:
            if lease_id is not None:
                await self._probe_release(name, ask, lease_id)
                continue
            try:
                answer = await self.clients[name].admit(**ask)
            except grpc.aio.AioRpcError as exc:
                ended = "belongs to lease" in (exc.details() or "")  # its lease has ended
                if not ended:
                    self.probe_unsettled.append((name, ask, None))
                continue
            if answer.decision.admitted:
                await self._probe_release(name, ask, answer.lease.lease_id)

    async def sampler(self) -> None:
        """Every agent's ledger, checked against its devices and the rules, and against
        the pods running on its node."""
        rules = self.rules
        while not self.stop.is_set():
            for name, client in self.clients.items():
                try:
                    node = await client.get_node(ledger_only=True)
                except grpc.aio.AioRpcError:  # a sample missed (an agent killed, say)
                    continue
                self.samples += 1
                self.check_running(name, {x.lease_id for x in node.leases})
                self.overcommit += ledger_problems(name, node, rules)
            await asyncio.sleep(self.args.sample_s)

    def check_running(self, node: str, live: set[str]) -> None:
        """Pods running on ``node`` whose lease is not live there: seen in two samples in a
        row (a lease may end a moment before its pod does), unless the pod was evicted."""
        running = [p for p in self.started_on.get(node, ()) if not (p.closing or p.evicted)]
        self.started_on[node] = running  # the ones that ended are not looked at again
        for plan in running:
            if plan.lease_id in live:
                self.missing.pop(plan.name, None)
                continue
            self.missing[plan.name] += 1
            if self.missing[plan.name] >= 2 and not evicted_event(self.cluster, plan):
                self.without_lease.add(plan.name)

    async def progress(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            await asyncio.sleep(self.args.progress_s)
            print(
                f"[{time.monotonic() - started:6.1f} s] created {self.created} bound "
                f"{self.bound} running {self.running} gone {self.finished} "
                f"binds p50 {pct(self.scheduler.bind_ms, 0.5)} ms, "
                f"admit p50 {pct(self.admit_ms, 0.5)} ms, "
                f"load {os.getloadavg()[0]:.2f}",
                file=sys.stderr,
                flush=True,
            )

    async def live_leases(self) -> list[tuple[str, str, str]]:
        """(node, pod or request id, lease id) of every live lease on every agent."""
        found = []
        for name, client in self.clients.items():
            node = await client.get_node(ledger_only=True)
            found += [(name, x.pod or x.request_id, x.lease_id) for x in node.leases]
        return found


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    random.seed(args.seed)
    units = plan_pods(args, rng)
    load_before = os.getloadavg()
    async with loopback_cluster(
        root,
        nodes=args.nodes,
        cluster_side=args.cluster_side,
        scheduler=False,
        agent_args=AGENT_ARGS,
        start_timeout_s=30.0 * args.nodes,  # 16 agents starting at once on 2 cores
        nri=args.injector == "nri",
        api_timeout_s=args.api_timeout_s,
    ) as (cluster, _):
        assert cluster.kubelets is not None
        chaos = _chaos(args, cluster) if args.faults or args.kill_agents else None
        scheduler = (TimedScheduler if args.scheduler == "inline" else RemoteScheduler)(
            cluster.api_server.url,
            cluster.extender_url,
            list(cluster.nodes),
            token=cluster.api_server.token,
        )
        bench = Run(args, cluster, scheduler, units, chaos=chaos)
        scheduler.on_bound = bench.on_bound
        cluster.kubelets.on_started = bench.on_started
        for name, node in cluster.nodes.items():
            client = AgentClient(node.target, token=cluster.agent_token, attempts=1, timeout_s=10)
            bench.clients[name] = await client.__aenter__()
        tasks: set[asyncio.Task[None]] = set()

        def spawn(coro: Any) -> None:
            task = asyncio.create_task(coro)
            tasks.add(task)

        print(f"{args.nodes} nodes up; {args.pods} pods to go", file=sys.stderr, flush=True)
        cluster.api_server.chaos = chaos
        await scheduler.__aenter__()
        beside = [
            asyncio.create_task(
                scheduler.run(concurrency=args.scheduling_cycles), name="scheduler"
            ),
            asyncio.create_task(bench.admit_probe(), name="admit-probe"),
            asyncio.create_task(bench.sampler(), name="sampler"),
            asyncio.create_task(bench.progress(), name="progress"),
        ]
        if args.faults:
            ending = end_watches(cluster.api_server.end_watches, args.end_watches_s)
            beside.append(asyncio.create_task(ending, name="watch-ends"))
        try:
            cpu_before = cpu_by_part(part_of)
            await _unless_ended(beside[0], bench.creator(spawn))
            await _unless_ended(beside[0], asyncio.gather(*tasks))
            done_at = time.monotonic()
            bench.cpu_ms_per_pod = ms_per(cpu_before, cpu_by_part(part_of), args.pods)
            bench.stop.set()  # the probe's own leases end with it
            cluster.api_server.chaos = None  # the count at the end is not faulted
            await asyncio.gather(*beside[1:3], return_exceptions=True)  # probe, sampler
            await _agents_back(cluster)
            for _ in range(50):  # the probe's unknown outcomes, settled with every agent up
                await bench.settle_probe()
                if not bench.probe_unsettled:
                    break
                await asyncio.sleep(0.2)
            options = cluster.options()  # the same intervals in both kinds of cluster side
            await asyncio.sleep(2 * (options.lease_grace_s + options.reconcile_interval_s))
            leases = await bench.live_leases()
            left = [key for (ns, key) in cluster.api_server.objects["pods"] if ns == NAMESPACE]
        finally:
            bench.stop.set()
            for task in beside:
                task.cancel()
            await asyncio.gather(*beside, return_exceptions=True)
            await scheduler.__aexit__(None, None, None)
            for client in bench.clients.values():
                await client.__aexit__(None, None, None)
    return summarize(bench, units, leases, left, done_at, load_before)


def _chaos(args: argparse.Namespace, cluster: LoopbackCluster) -> Chaos:
    """The API faults and agent kills of ``--faults`` and ``--kill-agents``."""
    restarts: set[asyncio.Task[None]] = set()

    def kill(node_name: str) -> bool:
        node = cluster.nodes.get(node_name)
        if (
            node is None
            or node.process is None
            or any(n.process is None for n in cluster.nodes.values())
        ):
            return False  # one agent away at a time
        node.kill()
        print(f"killed the agent of {node_name} mid-bind", file=sys.stderr, flush=True)
        task = asyncio.create_task(restart_later(node.start, args.restart_after_s))
        restarts.add(task)
        task.add_done_callback(restarts.discard)
        return True

    return Chaos(
        args.faults,
        random.Random(args.seed + 1),
        kill=kill,
        kill_every_s=args.kill_every_s,
        kills_left=args.kill_agents,
    )


async def _agents_back(cluster: LoopbackCluster) -> None:
    """Until every agent killed in the run is up again and registered with its kubelet."""
    for node in cluster.nodes.values():
        await eventually(lambda node=node: node.process is not None, 60.0)  # type: ignore[misc]
        await wait_agent(node, cluster.agent_token)
        await eventually(node.kubelet.healthy, 60.0)


async def _unless_ended(beside: asyncio.Task[None], work: Any) -> None:
    """Await ``work``; fail at once if ``beside`` (the scheduler) ends first: no bind would
    ever come, and the run would wait for them until every pod's deadline."""
    doing = asyncio.ensure_future(work)
    await asyncio.wait({doing, beside}, return_when=asyncio.FIRST_COMPLETED)
    if not doing.done():
        doing.cancel()
        beside.result()  # its failure, if it failed
        raise RuntimeError("the scheduler stand-in stopped")
    doing.result()


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with short_dir() as root:
        result = asyncio.run(run(args, root))
    print(f"{'figure':<24} value", flush=True)
    for key, value in result.items():
        print(f"{key:<24} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()


if __name__ == "__main__":
    main()
