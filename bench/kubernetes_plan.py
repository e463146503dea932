"""What bench/kubernetes.py runs: its command line, the sizes, the agents' settings and the
pods planned (each one's share, run time and ending; a tenth in gangs)."""

from __future__ import annotations

import argparse
import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

from tests.kubeworld.apiserver import Obj
from tests.kubeworld.cluster.device_plugin import (
    gpu_pod,
)

GIB = 2**30
NAMESPACE = "bench"
MEMORY_GIB = (1, 2, 4, 6, 8, 12)
THREADS = (5, 10, 15, 20, 25)
PRIORITIES = ("guaranteed", "burstable", "burstable", "best-effort")
ENDINGS = ("succeeded", "deleted", "force-deleted")
# The simulated node's MPS control front end is a Python program (about 0.2 s of CPU per
# command; the real one is a native binary): at the agents' default intervals, 16 nodes'
# daemon probes, readiness and janitor passes alone would take more than 2 cores. The pod
# flow measured here uses none of them.
AGENT_ARGS = tuple(
    arg
    for name in ("mps.probe_interval_s", "readiness.interval_s", "janitor.interval_s")
    for arg in ("--set", f"{name}=60")
)
FULL = {"nodes": 16, "pods": 2000}
SMALL = {"nodes": 4, "pods": 200}


@dataclass
class PodPlan:
    name: str
    memory_gib: int
    threads: int
    priority: str
    run_s: float
    ending: str
    gang: str = ""
    gang_size: int = 0
    uid: str = ""
    created_at: float = 0.0
    bound_at: float = 0.0
    phase: str = ""  # what the kubelet reported
    bound: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: str = ""  # "" (ran and went) or why the pod is lost
    evicted: bool = False  # deleted by the lease controller: its agent evicted its lease
    closing: bool = False  # the harness is ending it: its lease may go any moment
    rejected: bool = False  # Failed by its kubelet: its agent was away at its admission
    node: str = ""  # where the kubelet started it
    lease_id: str = ""  # its lease annotation, as the kubelet saw it

    def manifest(self) -> Obj:
        pod = gpu_pod(
            self.name,
            NAMESPACE,
            memory=f"{self.memory_gib}Gi",
            threads=str(self.threads),
            gang=self.gang,
            gang_size=self.gang_size,
            priority=self.priority,
        )
        return pod


def plan_pods(args: argparse.Namespace, rng: random.Random) -> list[list[PodPlan]]:
    """Units in creation order: a single pod, or a gang's members together."""
    low, high = args.run_s
    gangs = round(args.pods * args.gang_share / args.gang_size) if args.gang_size else 0
    singles = args.pods - gangs * args.gang_size
    kinds = ["single"] * singles + ["gang"] * gangs
    rng.shuffle(kinds)
    units: list[list[PodPlan]] = []
    counts = Counter[str]()

    def one(name: str, gang: str = "", size: int = 0) -> PodPlan:
        return PodPlan(
            name,
            rng.choice(MEMORY_GIB),
            rng.choice(THREADS),
            rng.choice(PRIORITIES),
            rng.uniform(low, high),
            rng.choice(ENDINGS),
            gang,
            size,
        )

    for kind in kinds:
        counts[kind] += 1
        if kind == "single":
            units.append([one(f"pod-{counts[kind]:05d}")])
        else:
            gang = f"gang-{counts[kind]:04d}"
            units.append([one(f"{gang}-{i}", gang, args.gang_size) for i in range(args.gang_size)])
    return units


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of bench/kubernetes.py, its sizes filled in."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--small", action="store_true", help="4 nodes, 200 pods")
    parser.add_argument("--nodes", type=int, default=None, help="simulated nodes (16)")
    parser.add_argument("--pods", type=int, default=None, help="pods created (2000)")
    parser.add_argument("--gang-share", type=float, default=0.1, help="pods in gangs (0.1)")
    parser.add_argument("--gang-size", type=int, default=4, help="members of a gang (4)")
    parser.add_argument(
        "--run-s",
        type=lambda text: tuple(float(x) for x in text.split(",")),
        default=(0.5, 3.0),
        help="how long a pod runs, uniform between LOW,HIGH seconds (0.5,3)",
    )
    parser.add_argument("--window", type=int, default=64, help="pods waiting unbound at most")
    parser.add_argument("--bind-deadline-s", type=float, default=120.0)
    parser.add_argument("--probe-s", type=float, default=0.1, help="between Admit probes")
    parser.add_argument("--sample-s", type=float, default=1.0, help="between ledger samples")
    parser.add_argument(
        "--cluster-side",
        choices=("process", "inline"),
        default="process",
        help="gpushare kube serve as its own process (the default, as deployed), or in "
        "the harness's process and event loop",
    )
    parser.add_argument(
        "--injector",
        choices=("device-plugin", "nri"),
        default="device-plugin",
        help="how a lease reaches its containers: the device plugin's Allocate (binds to "
        "a node one at a time), or each node's runtime with NRI too (its agent registers "
        "as an NRI plugin and binds go at once)",
    )
    parser.add_argument(
        "--scheduling-cycles",
        type=int,
        default=16,
        help="scheduling cycles (filter and prioritize) at once in the scheduler stand-in; "
        "kube-scheduler runs 1, its binding cycles beside it (16)",
    )
    parser.add_argument(
        "--scheduler",
        choices=("inline", "process"),
        default="inline",
        help="the scheduler stand-in in the harness's event loop (the default), or in a "
        "process of its own, as kube-scheduler runs",
    )
    parser.add_argument(
        "--faults",
        type=float,
        default=0.0,
        help="share of Bindings, pod patches and pod watches the API server answers with a "
        "fault (0: none; see bench/faults.py)",
    )
    parser.add_argument("--kill-agents", type=int, default=0, help="agents SIGKILLed mid-bind (0)")
    parser.add_argument(
        "--end-watches-s",
        type=float,
        default=3.0,
        help="with --faults: every watch is ended this often, and connects again (3)",
    )
    parser.add_argument("--kill-every-s", type=float, default=10.0, help="between kills (10)")
    parser.add_argument(
        "--restart-after-s", type=float, default=2.0, help="a killed agent starts again (2)"
    )
    parser.add_argument(
        "--api-timeout-s",
        type=float,
        default=None,
        help="gpushare kube serve's API request timeout (its default 30; 3 with --faults)",
    )
    parser.add_argument("--progress-s", type=float, default=5.0)
    parser.add_argument("--webhook", action="store_true", help="create through the webhook")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    size = SMALL if args.small else FULL
    args.nodes = args.nodes or size["nodes"]
    args.pods = args.pods or size["pods"]
    if args.api_timeout_s is None:
        args.api_timeout_s = 3.0 if args.faults else 30.0
    return args
