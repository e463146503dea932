"""The controller's probes (``--http-listen``): a standby is alive and ready (a rollout
goes on while the other replica leads); the leader is ready once it has listed the claims
and while its list and watch work, and alive unless its follow loop made no progress for
``stall_s`` (a wedged loop: the kubelet restarts it and the other replica takes over);
``/metrics`` says what it did. Through the real HTTP listener, and the real command."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agent.cli.dra import MIN_STALL_S
from agent.dracontrol.controller import BindingController, Counters
from agent.dracontrol.health import Progress
from agent.dracontrol.probes import COUNTER_HELP, PREFIX, ProbeServer
from agent.kubeapi.leader import LeaderElector
from agent.kubeapi.rest import RestKubeApi
from tests.dra.fixtures import TOKEN
from tests.dracontrol.helpers import Agents, claim, conditions, until
from tests.dracontrol.test_leader_and_agents import fast
from tests.helpers import REPO, agent_command, subprocess_env
from tests.kubeworld.apiserver import FakeApiServer


def test_progress_says_who_is_alive_and_ready() -> None:
    now = [0.0]
    progress = Progress(stall_s=100.0, clock=lambda: now[0])
    assert progress.role == "standby"
    assert progress.liveness_problems() == progress.readiness_problems() == []
    now[0] = 1000.0  # a standby has nothing to be stuck on
    assert progress.liveness_problems() == progress.readiness_problems() == []
    progress.began()
    assert progress.role == "leader" and progress.liveness_problems() == []
    assert progress.readiness_problems() == ["the ResourceClaims are not listed yet in this term"]
    progress.listed_all()
    assert progress.readiness_problems() == []
    progress.failed("503 ServiceUnavailable: down")
    assert progress.readiness_problems() == [
        "following the ResourceClaims fails: 503 ServiceUnavailable: down"
    ]
    assert progress.liveness_problems() == []  # a failure alone is not a wedge
    now[0] += 99.0
    assert progress.liveness_problems() == []
    now[0] += 1.0  # no step for stall_s while leading
    [stalled] = progress.liveness_problems()
    assert "no progress (list or watch) for 100 s" in stalled
    assert stalled in progress.readiness_problems()
    progress.stepped()  # a watch event, say
    assert progress.liveness_problems() == progress.readiness_problems() == []
    progress.ended()  # the Lease lost: a standby again
    now[0] += 1000.0
    assert progress.role == "standby" and progress.readiness_problems() == []
    progress.began()  # a new term lists again
    assert progress.readiness_problems() and progress.terms == 2


@contextlib.asynccontextmanager
async def probed(controller: BindingController) -> AsyncIterator[str]:
    server = ProbeServer(controller, listen="127.0.0.1:0", linked=lambda: 3)
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()


async def get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()


async def test_the_leaders_probes_follow_its_list_and_a_wedged_loop_fails_liveness(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    progress = Progress(stall_s=0.5)
    controller = BindingController(kube, Agents(), backoff_s=0.05, progress=progress)
    async with probed(controller) as url:
        assert await get(f"{url}/healthz") == (200, {"status": "ok", "role": "standby"})
        assert await get(f"{url}/readyz") == (200, {"status": "ready", "role": "standby"})
        held = api.hold_next("GET", r"/v1/resourceclaims\?limit=")  # the list hangs: wedged
        running = asyncio.create_task(controller.run())
        try:
            await held.arrived.wait()
            status, body = await get(f"{url}/readyz")
            assert (status, body["role"]) == (503, "leader")
            assert body["problems"] == ["the ResourceClaims are not listed yet in this term"]
            assert (await get(f"{url}/healthz"))[0] == 200
            await asyncio.sleep(0.6)  # no progress for stall_s
            status, body = await get(f"{url}/healthz")
            assert status == 503 and "no progress" in body["problems"][0]
            held.release.set()
            await until(lambda: progress.listed)
            assert await get(f"{url}/readyz") == (200, {"status": "ready", "role": "leader"})
            assert (await get(f"{url}/healthz"))[0] == 200
            api.put_object("resourceclaims", claim("c", "gpu-0"))
            await until(lambda: bool(conditions(api)))
            status, text = await get(f"{url}/metrics")
            assert status == 200
            assert f"{PREFIX}_answers_written_total 1.0" in text
            assert f"{PREFIX}_list_pages_total 1.0" in text
            assert f"{PREFIX}_leading 1.0" in text and f"{PREFIX}_agent_channels 3.0" in text
            for name in COUNTER_HELP:
                assert f"{PREFIX}_{name}_total" in text
            assert set(COUNTER_HELP) == set(vars(Counters()))  # every counter exported
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        assert await get(f"{url}/readyz") == (200, {"status": "ready", "role": "standby"})


async def test_the_standby_of_an_elected_pair_is_ready(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    a = BindingController(kube, Agents(), backoff_s=0.05)
    b = BindingController(kube, Agents(), backoff_s=0.05)
    a_elector, b_elector = LeaderElector(kube, fast("a")), LeaderElector(kube, fast("b"))
    tasks = [asyncio.create_task(a_elector.run(a.run))]
    try:
        await until(lambda: a.progress.listed)
        tasks.append(asyncio.create_task(b_elector.run(b.run)))
        async with probed(a) as a_url, probed(b) as b_url:
            await asyncio.sleep(0.3)  # b campaigns, and waits
            assert not b_elector.leading
            assert await get(f"{a_url}/readyz") == (200, {"status": "ready", "role": "leader"})
            assert await get(f"{b_url}/readyz") == (200, {"status": "ready", "role": "standby"})
            assert (await get(f"{b_url}/healthz"))[0] == 200
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- the command --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def command(api: FakeApiServer, tmp_path: Path, *extra: str) -> asyncio.subprocess.Process:
    token = tmp_path / "api-token"
    token.write_text(TOKEN)
    agents_token = tmp_path / "agent-token"
    agents_token.write_text("agents")
    return await asyncio.create_subprocess_exec(
        *agent_command("dra", "controller"),
        f"--api-server={api.url}",
        f"--api-token-file={token}",
        "--insecure-agents",
        f"--agent-token-file={agents_token}",
        "--no-leader-elect",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=subprocess_env(),
    )


async def test_the_command_serves_its_probes_and_stops_cleanly(
    api: FakeApiServer, tmp_path: Path
) -> None:
    port = free_port()
    process = await command(api, tmp_path, f"--http-listen=127.0.0.1:{port}")
    try:

        async def ready() -> bool:
            with contextlib.suppress(aiohttp.ClientError):
                return await get(f"http://127.0.0.1:{port}/readyz") == (
                    200,
                    {"status": "ready", "role": "leader"},
                )
            return False

        async with asyncio.timeout(30.0):
            while not await ready():
                assert process.returncode is None, await process.stdout.read()  # type: ignore[union-attr]
                await asyncio.sleep(0.1)
        status, text = await get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "gpushare_dra_controller_relists_total 1.0" in text
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        output = await process.stdout.read()  # type: ignore[union-attr]
        code = await process.wait()
    assert code == 0, output.decode()


@pytest.mark.parametrize(
    ("listen", "said"),
    [("nonsense", "is not HOST:PORT"), ("127.0.0.1:99999", "is not HOST:PORT")],
)
async def test_the_command_refuses_a_bad_listen_address(
    api: FakeApiServer, tmp_path: Path, listen: str, said: str
) -> None:
    process = await command(api, tmp_path, f"--http-listen={listen}")
    output, _ = await process.communicate()
    assert process.returncode == 2 and said in output.decode()


async def test_the_command_says_when_its_probe_port_is_taken(
    api: FakeApiServer, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = await command(api, tmp_path, f"--http-listen=127.0.0.1:{port}")
        output, _ = await process.communicate()
    assert process.returncode == 2
    assert f"--http-listen: cannot serve on 127.0.0.1:{port}" in output.decode()


def test_the_deployment_probes_the_port_and_paths_the_command_serves() -> None:
    manifests = yaml.safe_load_all((REPO / "deploy" / "dra" / "controller.yaml").read_text())
    [deployment] = [d for d in manifests if d and d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    options = dict(a.split("=", 1) for a in container["args"][2:])
    host, _, port = options["--http-listen"].rpartition(":")
    assert host == "0.0.0.0"  # the kubelet probes the pod's address
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == int(port)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert float(options["--stall-s"]) >= MIN_STALL_S  # the command takes it
