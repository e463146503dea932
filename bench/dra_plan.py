"""bench/dra.py's run: its sizes, the agents' settings it quiets, and the pods it plans
(each one's template, run time and ending)."""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from dataclasses import dataclass, field

from tests.kubeworld.apiserver import (
    Obj,
)
from tests.kubeworld.cluster.dra import (
    claim_pod,
)

NAMESPACE = "bench"
TEMPLATES = {  # name -> (memory, threads)
    "s4g-t10": ("4Gi", "10"),
    "m8g-t25": ("8Gi", "25"),
    "l16g-t25": ("16Gi", "25"),
    "x20g-t50": ("20Gi", "50"),
}
EXTENDED = ""  # a pod's template "": it asks for the extended resource only
EXTENDED_RESOURCE = "gpushare.io/gpu"
ENDINGS = ("graceful", "force")
KUBELET_FINALIZER = "bench.gpushare.io/kubelet"  # a graceful pod stays until it was stopped
# The simulated node's MPS control front end is a Python program: at the agents' default
# intervals, 16 nodes' daemon probes, readiness and janitor passes alone would take more
# than 2 cores (as in bench/kubernetes.py). The pod flow measured here uses none of them.
QUIET_AGENT = {"mps.probe_interval_s": 60, "readiness.interval_s": 60, "janitor.interval_s": 60}
FULL = {"nodes": 16, "pods": 2000}
SMALL = {"nodes": 4, "pods": 200}
POLL_S = 0.05
WINDOW_S = 1.0  # of the slice-write rate


@dataclass
class PodPlan:
    name: str
    template: str  # EXTENDED: the extended resource only
    run_s: float
    ending: str
    uid: str = ""
    node: str = ""
    claim: str = ""  # its ResourceClaim's name, once Running
    created_at: float = 0.0
    running_at: float = 0.0
    outcome: str = ""  # "" (ran and went), or why the pod is lost
    checked: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> tuple[str, str]:
        return NAMESPACE, self.name

    def manifest(self) -> Obj:
        if self.template:
            pod = claim_pod(self.name, self.template, NAMESPACE)
        else:
            limits = {EXTENDED_RESOURCE: "1"}
            container = {"name": "main", "image": "app", "resources": {"limits": limits}}
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": self.name, "namespace": NAMESPACE},
                "spec": {"securityContext": {"runAsUser": 1000}, "containers": [container]},
            }
        if self.ending == "graceful":
            pod["metadata"]["finalizers"] = [KUBELET_FINALIZER]
        return pod


def plan_pods(args: argparse.Namespace, rng: random.Random) -> list[PodPlan]:
    low, high = args.run_s
    plans = []
    for index in range(args.pods):
        extended = rng.random() < args.extended_share
        template = EXTENDED if extended else rng.choice(sorted(TEMPLATES))
        run_s = rng.uniform(low, high)
        plans.append(PodPlan(f"pod-{index:05d}", template, run_s, rng.choice(ENDINGS)))
    return plans


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
