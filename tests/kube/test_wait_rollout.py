"""`gpushare kube wait-rollout daemonset/NAME` as a real process against the stand-in API
server: done when the DaemonSet's controller says every pod is ready, waiting while it is
not (or has not seen the latest spec), naming the nodes whose pods are not ready at the
timeout, failing at once when RBAC refuses, and waiting out passing API errors; with
--delete-first, deleting the agents' DaemonSet (propagationPolicy Background) before its
first read."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import subprocess_env
from tests.kubeworld.apiserver import FakeApiServer

NS = "gpushare"
DS = "gpushare-reset-compute-mode"
LABELS = {"app.kubernetes.io/name": DS}
TOKEN = "t0ken"


def daemon_set(
    desired: int, ready: int, *, generation: int = 1, observed: int = 1
) -> dict[str, Any]:
    """The DaemonSet as its controller leaves it (status included)."""
    return {
        "metadata": {"name": DS, "namespace": NS, "generation": generation},
        "spec": {
            "selector": {"matchLabels": LABELS},
            "template": {"metadata": {"labels": LABELS}, "spec": {"containers": []}},
        },
        "status": {
            "observedGeneration": observed,
            "desiredNumberScheduled": desired,
            "currentNumberScheduled": desired,
            "numberReady": ready,
            "numberAvailable": ready,
            **({"numberUnavailable": desired - ready} if desired > ready else {}),
        },
    }


def put_pod(api: FakeApiServer, node: str, *, ready: bool, message: str = "") -> None:
    name = f"{DS}-{node}"
    api.create_pod(name, NS, labels=LABELS, node_name=node)
    container: dict[str, Any] = {"name": "reset-compute-mode", "ready": ready}
    if ready:
        container["state"] = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    else:
        container["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
        container["lastState"] = {"terminated": {"exitCode": 1, "message": message}}
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [container],
    }
    api.patch_pod(NS, name, {"status": status}, subresource="status")


async def wait(api: FakeApiServer, tmp_path: Path, timeout_s: float = 20.0, *extra: str) -> Any:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    argv = [
        sys.executable, "-m", "agent", "kube", "wait-rollout", f"daemonset/{DS}", "-n", NS,
        "--api-server", api.url, "--api-token-file", str(token),
        "--timeout-s", str(timeout_s), "--interval-s", "0.1", "--api-timeout-s", "5", *extra,
    ]  # fmt: skip
    return await asyncio.to_thread(
        subprocess.run, argv, env=subprocess_env(), capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


async def test_ready_at_once(tmp_path: Path) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(2, 2))
        done = await wait(api, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [f"daemonset/{DS}: 2/2 pods ready: done"]


async def test_no_node_selected_is_done_once_the_controller_has_seen_it(tmp_path: Path) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(0, 0))
        done = await wait(api, tmp_path)
    assert done.returncode == 0 and "0/0 pods ready: done" in done.stdout, done.stderr


async def read_again(api: FakeApiServer) -> None:
    """Until the command has read the DaemonSet twice more: once surely after now."""
    wanted = api.requests["get"] + 2
    while api.requests["get"] < wanted:
        await asyncio.sleep(0.02)


async def test_it_waits_for_the_controller_and_the_pods_then_is_done(tmp_path: Path) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        # all ready, but for the previous spec: not done
        api.put_object("daemonsets", daemon_set(2, 2, generation=2, observed=1))
        waiting = asyncio.ensure_future(wait(api, tmp_path))
        for ready in (0, 1):
            await asyncio.wait_for(read_again(api), 30)
            assert not waiting.done()
            api.put_object("daemonsets", daemon_set(2, ready, generation=2, observed=2))
        await asyncio.wait_for(read_again(api), 30)
        assert not waiting.done()
        api.put_object("daemonsets", daemon_set(2, 2, generation=2, observed=2))
        done = await waiting
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.removeprefix(f"daemonset/{DS}: ") for line in done.stdout.splitlines()]
    assert lines == [
        "waiting for the DaemonSet controller to see the DaemonSet",
        "0/2 pods ready, 2 unavailable",
        "1/2 pods ready, 1 unavailable",
        "2/2 pods ready: done",
    ]


async def test_the_timeout_names_the_nodes_not_ready_and_why(tmp_path: Path) -> None:
    refusal = "GPU 1 GPU-13c0: cannot set the compute mode of GPU-13c0: NVML error 4"
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(3, 1))
        put_pod(api, "gpu-a", ready=True)
        put_pod(api, "gpu-b", ready=False, message=refusal)
        api.create_pod("other", NS, labels={"app.kubernetes.io/name": "x"}, node_name="gpu-c")
        done = await wait(api, tmp_path, timeout_s=1.0)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert f"daemonset/{DS}: not every pod ready after 1 s" in lines
    assert (
        f"  node gpu-b: pod {DS}-gpu-b not ready (CrashLoopBackOff; last exit 1: {refusal})"
    ) in lines
    assert "  1 of 3 pods not created yet" in lines
    assert not any("gpu-a" in line or "gpu-c" in line for line in lines)


async def test_a_refusal_by_rbac_fails_at_once_with_exit_2(tmp_path: Path) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(1, 0))
        api.fail_next("GET", "/daemonsets/", 403, reason="Forbidden", message="no get", times=9)
        done = await wait(api, tmp_path)
        gets = api.requests["get"]
    assert done.returncode == 2, done.stdout + done.stderr
    assert "403 Forbidden" in done.stderr and "`get` on daemonsets in gpushare" in done.stderr
    assert gets == 1  # not tried again


async def test_api_errors_are_waited_out(tmp_path: Path) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(1, 1))
        api.fail_next("GET", "/daemonsets/", 503, reason="ServiceUnavailable", times=3)
        done = await wait(api, tmp_path)
        gets = api.requests["get"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cannot read it (503 ServiceUnavailable" in done.stdout
    assert done.stdout.splitlines()[-1] == f"daemonset/{DS}: 1/1 pods ready: done"
    assert gets == 4


AGENTS = "gpushare-agent"
AGENTS_PATH = f"/apis/apps/v1/namespaces/{NS}/daemonsets/{AGENTS}"


def agents_daemon_set() -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": AGENTS}
    return {
        "metadata": {"name": AGENTS, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": []}},
        },
    }


async def test_delete_first_deletes_the_agents_in_the_background_before_the_wait(
    tmp_path: Path,
) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(1, 1))
        api.put_object("daemonsets", agents_daemon_set())
        done = await wait(api, tmp_path, 20.0, "--delete-first", f"daemonset/{AGENTS}")
        left = {name for _, name in api.objects["daemonsets"]}
        calls = [(method, path) for method, path, _ in api.log]
        deletions = api.deletions
    assert done.returncode == 0, done.stdout + done.stderr
    assert left == {DS}  # the object is gone at once; its pods go after it
    assert deletions == [(AGENTS_PATH, {**deletions[0][1], "propagationPolicy": "Background"})]
    assert calls[0] == ("DELETE", AGENTS_PATH)  # before the first read of the reset
    assert calls[1:] == [("GET", f"/apis/apps/v1/namespaces/{NS}/daemonsets/{DS}")]
    assert done.stdout.splitlines()[0] == f"daemonset/{AGENTS}: deleted (its pods go after it)"


async def test_delete_first_of_agents_gone_already_is_fine(tmp_path: Path) -> None:
    """A second try of the Job: the first deleted them."""
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(1, 1))
        done = await wait(api, tmp_path, 20.0, "--delete-first", f"daemonset/{AGENTS}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"daemonset/{AGENTS}: not found in namespace {NS}: gone already" in done.stdout


async def test_delete_first_refused_by_rbac_fails_at_once_without_waiting(tmp_path: Path) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(1, 1))
        api.put_object("daemonsets", agents_daemon_set())
        api.fail_next("DELETE", "/daemonsets/", 403, reason="Forbidden", message="no", times=9)
        done = await wait(api, tmp_path, 20.0, "--delete-first", f"daemonset/{AGENTS}")
        methods = [method for method, _, _ in api.log]
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"`delete` on daemonsets/{AGENTS} in {NS}" in done.stderr
    assert methods == ["DELETE"]  # not tried again, and no wait


async def test_delete_first_waits_out_passing_api_errors(tmp_path: Path) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(1, 1))
        api.put_object("daemonsets", agents_daemon_set())
        api.fail_next("DELETE", "/daemonsets/", 503, reason="ServiceUnavailable", times=2)
        done = await wait(api, tmp_path, 20.0, "--delete-first", f"daemonset/{AGENTS}")
        left = {name for _, name in api.objects["daemonsets"]}
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("cannot delete it (503 ServiceUnavailable") == 2
    assert left == {DS}


# Every outcome of the one write the Job makes, the agents' DaemonSet's DELETE, as a row:
# (fault on the DELETE, what the Job says of it). The API timeout is 1 s here so that a
# hanging request costs little; each row ends with the agents gone and the wait done.
DELETE_OUTCOMES = {
    "done": ({}, ["deleted (its pods go after it)"]),
    "failed, not done (503), tried again": (
        {"status": 503, "reason": "ServiceUnavailable"},
        ["cannot delete it (503 ServiceUnavailable", "deleted (its pods go after it)"],
    ),
    "failed but done (503 after it landed)": (
        {"status": 503, "reason": "ServiceUnavailable", "landed": True},
        ["cannot delete it (503 ServiceUnavailable", "gone already"],
    ),
    "the answer lost (connection broken after it landed)": (
        {"status": 0, "landed": True, "times": 2},
        ["gone already"],
    ),
    "timed out, not done": ({"hang": True}, ["cannot delete it", "deleted (its pods go"]),
    "timed out, done": ({"hang": True, "landed": True}, ["cannot delete it", "gone already"]),
}


@pytest.mark.parametrize("outcome", list(DELETE_OUTCOMES))
async def test_every_outcome_of_the_delete_ends_with_the_agents_gone(
    outcome: str, tmp_path: Path
) -> None:
    fault, said = DELETE_OUTCOMES[outcome]
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(1, 1))
        api.put_object("daemonsets", agents_daemon_set())
        if fault:
            api.fail_next("DELETE", "/daemonsets/", **fault)
        done = await wait(
            api, tmp_path, 20.0, "--delete-first", f"daemonset/{AGENTS}", "--api-timeout-s", "1"
        )
        left = {name for _, name in api.objects["daemonsets"]}
    assert done.returncode == 0, done.stdout + done.stderr
    assert left == {DS}
    lines = [line for line in done.stdout.splitlines() if line.startswith(f"daemonset/{AGENTS}")]
    for words in said:  # in this order
        at = next((i for i, line in enumerate(lines) if words in line), None)
        assert at is not None, (words, done.stdout)
        lines = lines[at + 1 :]
    assert done.stdout.splitlines()[-1] == f"daemonset/{DS}: 1/1 pods ready: done"


async def test_a_delete_failing_every_time_fails_the_job_and_says_why(tmp_path: Path) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(1, 1))
        api.put_object("daemonsets", agents_daemon_set())
        api.fail_next("DELETE", "/daemonsets/", 503, reason="ServiceUnavailable", times=9)
        done = await wait(api, tmp_path, 20.0, "--delete-first", f"daemonset/{AGENTS}")
        methods = [method for method, _, _ in api.log]
    assert done.returncode == 1, done.stdout + done.stderr
    assert methods == ["DELETE"] * 5  # five tries, then no wait: the agents may still run
    assert "503 ServiceUnavailable" in done.stderr


async def test_a_read_that_times_out_is_waited_out(tmp_path: Path) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        api.put_object("daemonsets", daemon_set(1, 1))
        api.fail_next("GET", "/daemonsets/", hang=True)
        done = await wait(api, tmp_path, 20.0, "--api-timeout-s", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cannot read it" in done.stdout
    assert done.stdout.splitlines()[-1] == f"daemonset/{DS}: 1/1 pods ready: done"
