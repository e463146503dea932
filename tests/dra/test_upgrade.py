"""A DaemonSet upgrade of the DRA driver on the loopback cluster: the old agent process is
sent SIGTERM, the new one (same configuration, same state, plugin, registry and CDI
directories) starts while the old one still stops, and all the while the kubelet's
stand-in keeps sending Prepare and Unprepare for several claims, retrying what fails as
the kubelet's pod worker does. Every claim ends up prepared once (one lease each, the same
before and after), the specs of the claims prepared before are untouched, the new agent is
registered with the kubelet, and Unprepare after the upgrade releases.

The DaemonSet controller creates the new pod as soon as the old one is terminating (it
skips pods with a deletion timestamp; it does not wait for them to be gone), so the new
agent can start while the old one still holds the single-agent lock. Whether it does
depends on the machine's speed; here it is made certain: the new process is started
while the old one runs, and the old one is sent SIGTERM once the new one is at the lock
(has a lock file open, or has exited). Then:

* the new agent waits for the lock and takes over (``runtime.lock_wait_s``, as the chart
  sets it), or
* a new process that exits is started again after a back-off, as the kubelet restarts a
  failed container (CrashLoopBackOff: 10 s doubling in the kubelet; shortened here).

And in the DaemonSet's own order, with the kubelet's restarts: SIGTERM, then the new
process at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import psutil
import pytest

from agent.dra.proto import dra_v1_pb2_grpc
from tests.dra.test_end_to_end import running
from tests.kubeworld.cluster.dra import (
    DRIVER,
    DraCluster,
    DraNode,
    claim_pod,
    claim_template,
    dra_cluster,
    eventually,
)
from tests.kubeworld.kubelet import DraKubelet, Retry
from tests.kubeworld.kubelet.fake_plugin import FakeDraPlugin, make_claim

pytestmark = pytest.mark.timeout(120)

# the kubelet's pod worker, shortened: Prepare and Unprepare tried again until they succeed
KUBELET_RETRY = Retry(first_s=0.1, max_s=1.0, deadline_s=90.0)
LOCK_REACHED_S = 20.0  # at most this long for the new process to reach the lock
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 4.0)  # the kubelet's container restart back-off, shortened
BEFORE = ("p0", "p1", "p2", "p3")  # pods running before the switch
DURING = ("q0", "q1", "q2", "q3")  # pods bound before the switch, run during it
EXIT_ALREADY_RUNNING = 3  # agent/cli/exits.py


def pod_uid(cluster: DraCluster, pod: str) -> str:
    found = cluster.api_server.pod("default", pod)
    assert found is not None, pod
    return str(found["metadata"]["uid"])


def spec_lease(spec: dict[str, Any]) -> str:
    [device] = spec["devices"]
    env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
    return str(env["GPUSHARE_LEASE_ID"])


def lock_files(node: DraNode) -> set[str]:
    """The single-agent lock files (agent/runtime/lock.py) of the node's agent."""
    return {
        os.path.realpath(f"{node.socket}.lock"),
        os.path.realpath(node.root / "state" / "agent.lock"),
    }


def at_the_lock(process: subprocess.Popen[bytes], node: DraNode) -> bool:
    """The process has exited, or has a lock file open (it is trying to take it)."""
    if process.poll() is not None:
        return True
    try:
        opened = {f.path for f in psutil.Process(process.pid).open_files()}
    except psutil.Error:
        return False
    return bool(opened & lock_files(node))


async def exited(process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> int:
    async with asyncio.timeout(timeout_s):
        while process.poll() is None:
            await asyncio.sleep(0.05)
    return process.returncode


def last_lines(node: DraNode, count: int = 3) -> str:
    return "\n".join(node.log_text().strip().splitlines()[-count:])


async def restart_on_exit(node: DraNode, exits: list[int]) -> None:
    """The kubelet's container restarts: an agent process that exited is started again
    after a back-off that doubles."""
    restarts = 0
    while True:
        process = node.process
        if process is not None and process.poll() is not None:
            exits.append(process.returncode)
            await asyncio.sleep(RESTART_BACKOFF_S[min(restarts, len(RESTART_BACKOFF_S) - 1)])
            restarts += 1
            node.start()
        await asyncio.sleep(0.05)


async def serving(node: DraNode, registrations: int, *, restarted: bool) -> None:
    """Until the new agent answers on its API socket and the kubelet registered it."""
    async with asyncio.timeout(90):
        while True:
            process = node.process
            if not restarted and process is not None and process.poll() is not None:
                raise AssertionError(
                    f"the new agent exited with code {process.returncode}:\n{last_lines(node)}"
                )
            with contextlib.suppress(Exception):
                await node.call("get_node")
                if node.kubelet.registrations > registrations and DRIVER in (
                    node.kubelet.registered
                ):
                    return
            await asyncio.sleep(0.1)


async def upgrade(root: Path, *, new_first: bool, restarted: bool) -> None:
    # as the chart runs it: a new agent waits for the old one's lock (not when restarted
    # by the kubelet: that variant shows the exit and the restart instead)
    settings = {} if restarted else {"runtime.lock_wait_s": 60}
    async with dra_cluster(root, nodes=1, settings=settings) as cluster:
        [node] = cluster.nodes.values()
        kubelet, runner = node.kubelet, cluster.running
        kubelet.retry = KUBELET_RETRY
        await cluster.apply(claim_template("t", memory="4Gi", threads="10"))
        runner.held.update(("default", name) for name in DURING)
        for name in (*BEFORE, *DURING):
            await cluster.apply(claim_pod(name, "t"))
        await running(cluster, *BEFORE)
        # the others allocated, admitted at their binding, bound: their Prepare is to come
        await eventually(lambda: all(("default", n) in runner.waiting for n in DURING), 60)
        claims = {name: cluster.claim_uid(name) for name in (*BEFORE, *DURING)}
        pods = {name: pod_uid(cluster, name) for name in (*BEFORE, *DURING)}
        leases_before = await node.lease_ids()
        assert sorted(leases_before) == sorted(claims.values())  # one each, so far
        specs_before = node.specs()
        assert sorted(specs_before) == sorted(claims[n] for n in BEFORE)
        registrations, calls = kubelet.registrations, len(kubelet.calls)

        old = node.process
        assert old is not None
        exits: list[int] = []
        restarter = None
        try:
            if not new_first:
                old.send_signal(signal.SIGTERM)
            node.start()  # the DaemonSet's new pod
            assert node.process is not None
            first: subprocess.Popen[bytes] = node.process
            if restarted:
                restarter = asyncio.create_task(restart_on_exit(node, exits))
            if new_first:
                with contextlib.suppress(TimeoutError):
                    await eventually(lambda: at_the_lock(first, node), LOCK_REACHED_S)
                if not restarted and first.poll() is not None:
                    raise AssertionError(
                        f"the new agent exited with code {first.returncode} while the old one "
                        f"held the lock, instead of waiting for it:\n{last_lines(node)}"
                    )
                old.send_signal(signal.SIGTERM)
            # the kubelet goes on: pods start (Prepare), pods stop (Unprepare) ...
            for name in DURING[:2]:
                runner.release("default", name)
            cluster.api_server.delete_pod("default", "p0")
            # ... and more once the old agent's registration socket is gone
            await kubelet.wait_for(lambda: DRIVER not in kubelet.registered, 60)
            for name in DURING[2:]:
                runner.release("default", name)
            cluster.api_server.delete_pod("default", "p1")
            code = await exited(old)
            assert code == 0, f"the old agent stopped with code {code}"
            new = node.process
            assert new is not None
            if not restarted and new.poll() is not None:
                raise AssertionError(
                    f"the new agent exited with code {new.returncode} while the old one "
                    f"held the lock, instead of waiting for it:\n{last_lines(node)}"
                )
            await serving(node, registrations, restarted=restarted)
        finally:
            if restarter is not None:
                restarter.cancel()
                await asyncio.gather(restarter, return_exceptions=True)
            if old.poll() is None:  # stopped as the cluster stops its agents
                old.send_signal(signal.SIGTERM)
                try:
                    await exited(old, 30)
                except TimeoutError:
                    old.kill()
                    await exited(old)

        # the new agent is registered: its endpoint is the plugin's socket
        assert kubelet.registered[DRIVER].endpoint == str(
            node.root / "plugins" / DRIVER / "dra.sock"
        )
        # every Prepare eventually succeeded, every Unprepare too
        await running(cluster, *DURING)
        for name in DURING:
            assert ("default", name) not in runner.errors, runner.errors
            for container in runner.containers[("default", name)].values():
                assert not container.error, (name, container.error)
        stopped = (pods["p0"], pods["p1"])
        try:
            await eventually(lambda: all(uid in runner.stopped for uid in stopped), 60)
        except TimeoutError:
            mine = {claims["p0"], claims["p1"]}
            raise AssertionError(
                f"not unprepared: {[n for n in ('p0', 'p1') if pods[n] not in runner.stopped]}; "
                f"the calls for them: {[c for c in kubelet.calls if mine & set(c.errors)]}"
            ) from None
        assert runner.stopped[pods["p0"]] == {claims["p0"]: ""}
        assert runner.stopped[pods["p1"]] == {claims["p1"]: ""}
        # the kubelet felt the switch: some of its calls failed and were sent again
        failed = [c for c in kubelet.calls[calls:] if c.failed]
        assert failed, kubelet.calls[calls:]

        # one lease per claim still prepared, the one it had: nothing prepared twice
        live = [n for n in (*BEFORE, *DURING) if n not in ("p0", "p1")]
        now = await node.lease_ids()
        assert Counter({uid: len(ids) for uid, ids in now.items()}) == Counter(
            {claims[n]: 1 for n in live}
        )
        for name in live:
            assert now[claims[name]] == leases_before[claims[name]], name
        # the specs: those of before untouched, the new ones with their lease, the
        # unprepared ones gone
        specs = node.specs()
        assert sorted(specs) == sorted(claims[n] for n in live)
        for name in ("p2", "p3"):
            assert specs[claims[name]] == specs_before[claims[name]], name
        for name in DURING:
            assert spec_lease(specs[claims[name]]) == now[claims[name]][0], name
            env = runner.env("default", name)
            assert env["GPUSHARE_LEASE_ID"] == now[claims[name]][0], name

        # Unprepare after the upgrade releases
        cluster.api_server.delete_pod("default", "p2")
        await eventually(lambda: pods["p2"] in runner.stopped, 60)
        assert runner.stopped[pods["p2"]] == {claims["p2"]: ""}
        assert claims["p2"] not in await node.lease_ids()
        assert not node.spec_file(claims["p2"]).exists()
        if restarted:  # what the kubelet saw of the new agent's first tries
            assert all(code == EXIT_ALREADY_RUNNING for code in exits), exits


async def test_a_new_agent_started_beside_the_old_one_waits_for_its_lock_and_takes_over(
    root: Path,
) -> None:
    await upgrade(root, new_first=True, restarted=False)


@pytest.mark.parametrize("new_first", [True, False], ids=["new-at-the-lock", "sigterm-first"])
async def test_an_upgrade_keeps_prepare_and_unprepare_answered_across_container_restarts(
    root: Path, new_first: bool
) -> None:
    await upgrade(root, new_first=new_first, restarted=True)


# -- the kubelet stand-in's retries --------------------------------------------------------


async def test_the_kubelets_retry_sends_failed_claims_again_until_they_succeed(
    root: Path,
) -> None:
    retry = Retry(first_s=0.05, max_s=0.2, deadline_s=30.0)
    async with DraKubelet(root / "registry", node_name="node-a", retry=retry) as kubelet:
        plugin = FakeDraPlugin(root)
        plugin.prepare_errors["uid-2"] = "not yet"
        claims = [make_claim("one", "uid-1"), make_claim("two", "uid-2")]
        preparing = asyncio.create_task(kubelet.prepare(claims))
        # not registered: tried, failed, tried again
        await kubelet.wait_for(lambda: len(kubelet.calls) >= 2)
        assert all("is not registered" in c.errors["uid-1"] for c in kubelet.calls)
        await plugin.start()
        try:
            await kubelet.wait_for(lambda: any(not c.failed.get("uid-1") for c in kubelet.calls))
            plugin.prepare_errors.clear()
            results = await preparing
            assert all(not isinstance(r, str) for r in results.values()), results
            # the claim done is not sent again; the failed one is, until done
            sent = [uids for _, method, uids in plugin.calls if method == "NodePrepareResources"]
            assert sent[0] == ["uid-1", "uid-2"] and all(s == ["uid-2"] for s in sent[1:])
            assert await kubelet.unprepare(claims) == {"uid-1": "", "uid-2": ""}
        finally:
            await plugin.stop()

    # without a retry, one try; with one, tries end at the deadline
    async with DraKubelet(root / "registry", node_name="node-a") as once:
        assert isinstance((await once.prepare(claims[:1]))["uid-1"], str)
        assert len(once.calls) == 1
    short = Retry(first_s=0.05, max_s=0.05, deadline_s=0.5)
    async with DraKubelet(root / "registry", node_name="node-a", retry=short) as bounded:
        result = (await bounded.prepare(claims[:1]))["uid-1"]
        assert isinstance(result, str) and "is not registered" in result
        assert 1 <= len(bounded.calls) <= 11  # the back-off bounds the tries


async def test_a_call_under_way_when_its_plugin_goes_fails_and_is_sent_again(root: Path) -> None:
    """A plugin deregistered during a call (its registration socket gone): the kubelet
    closes its connection, the call fails (CANCELLED) and the retry sends it again."""
    plugin = FakeDraPlugin(root, serve_dra=False)
    entered = asyncio.Event()

    class Stuck(dra_v1_pb2_grpc.DRAPluginServicer):
        async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            entered.set()
            await asyncio.sleep(60)  # cut short by the server's stop

    stuck = grpc.aio.server()
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(Stuck(), stuck)
    stuck.add_insecure_port(f"unix://{plugin.dra_socket}")
    await stuck.start()
    retry = Retry(first_s=0.05, max_s=0.2, deadline_s=30.0)
    claim = make_claim("one", "uid-1")
    try:
        async with DraKubelet(root / "registry", node_name="node-a", retry=retry) as kubelet:
            await plugin.start()
            await kubelet.wait_registered(DRIVER)
            unpreparing = asyncio.create_task(kubelet.unprepare([claim]))
            await asyncio.wait_for(entered.wait(), 10)
            await plugin.stop_registration()
            await kubelet.wait_for(lambda: kubelet.calls)
            assert (
                kubelet.calls[0]
                .errors["uid-1"]
                .startswith("NodeUnprepareResources failed: CANCELLED")
            )
            await stuck.stop(0)
            plugin.dra_socket.unlink(missing_ok=True)
            plugin.serve_dra = True
            await plugin.start()  # served again: answered
            assert await unpreparing == {"uid-1": ""}
    finally:
        await stuck.stop(0)
        await plugin.stop()
