"""The security part of bench/reliability.py: the real agent tried from outside as an
attacker on the node or the network would, each count must be 0.

- ``unauthenticated_accepted``: calls answered OK without credentials (no token, a wrong
  token, no client certificate, a certificate of another CA) on TLS listeners;
- ``plaintext_token_accepted``: a plaintext TCP listener with a token that starts without
  ``api.insecure_loopback`` or off loopback, and plaintext calls answered by a TLS listener;
- ``foreign_release_accepted``: Release, Commit and Abort of another caller's leases and
  gangs (two named tokens) answered OK;
- ``forged_identity_actions``: a real process that carries another lease's marker in its
  environment, bound to no matching cgroup, making that lease ready (or anything else);
- ``world_writable_files``: files others can write and reach (state, socket, runtime and
  MPS pipe and log directories, token), and secrets others can read, after a run.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import stat
import subprocess
import sys
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import REPO, Agent

sys.path.insert(0, str(REPO))

from agent.client import AgentClient, Priority, tls_credentials
from agent.core.lease import LeaseState
from agent.core.types import AdmissionRequest, GpuProcess, PriorityClass
from agent.core.units import GIB
from agent.gpu.fake import FakeGpuBackend, FakeTelemetrySource
from agent.mps.fake import FakeMpsManager
from agent.runtime.app import Ports
from tests.certs import Pki, make_client, make_pki
from tests.helpers import running_app, sim_settings

REQUEST = {"tenant": "t", "trust_domain": "t", "priority": Priority.BURSTABLE,
           "memory_bytes": 2 * GIB, "thread_pct": 5}  # fmt: skip


SECURITY_COUNTS = (
    "unauthenticated_accepted",
    "plaintext_token_accepted",
    "forged_identity_actions",
    "foreign_release_accepted",
    "world_writable_files",
)
PKI_DIRS = ("pki", "stranger")  # the test CAs' own files, not the agent's


def tls_args(pki: Pki, *, mutual: bool) -> tuple[str, ...]:
    args = ("--set", "api.insecure_loopback=false",
            "--set", f"api.tls_cert_file={pki.server_cert}",
            "--set", f"api.tls_key_file={pki.server_key}")  # fmt: skip
    return (*args, "--set", f"api.tls_client_ca_file={pki.ca}") if mutual else args


async def accepted(call: Awaitable[Any]) -> int:
    """1 if the call was answered, 0 if it was refused (any gRPC error)."""
    try:
        async with asyncio.timeout(10):
            await call
    except (grpc.aio.AioRpcError, TimeoutError):
        return 0
    return 1


async def ping(target: str, **options: Any) -> int:
    async with AgentClient(target, attempts=1, timeout_s=3, **options) as client:
        return await accepted(client.ping())


async def unauthenticated(root: Path, pki: Pki, stranger: Pki) -> dict[str, int]:
    counts = {"unauthenticated_accepted": 0, "plaintext_token_accepted": 0, "calls": 0}
    ca = str(pki.ca)
    for mutual in (False, True):
        agent = Agent(root / f"tls-{mutual}", tls_args(pki, mutual=mutual))
        agent.root.mkdir()
        agent.start()
        await agent.ready()
        target = f"127.0.0.1:{agent.tcp_port}"
        token = (agent.root / "token").read_text()
        tries = [
            ping(target, credentials=tls_credentials(ca)),
            ping(target, credentials=tls_credentials(ca), token="wrong" * 8),
            ping(target, credentials=tls_credentials(
                str(stranger.ca), cert_file=str(stranger.client_cert),
                key_file=str(stranger.client_key))),
        ]  # fmt: skip
        if mutual:
            tries.append(ping(target, credentials=tls_credentials(ca), token=token))
        counts["unauthenticated_accepted"] += sum([await t for t in tries])
        counts["plaintext_token_accepted"] += await ping(target, token=token)
        counts["calls"] += len(tries) + 1
        agent.stop()
    return counts


def refuses_to_start(root: Path, *extra: str) -> int:
    """1 if ``gpushare serve`` started with these settings (it must exit 2 at once)."""
    agent = Agent(root, extra)
    root.mkdir()
    agent.start()
    assert agent.process is not None
    try:
        code = agent.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        agent.stop()
        return 1
    return int(code != 2)


def plaintext_configs(root: Path) -> int:
    started = refuses_to_start(root / "plain", "--set", "api.insecure_loopback=false")
    off_loopback = ("--tcp-listen", "0.0.0.0:0", "--set", "api.insecure_loopback=true")
    return started + refuses_to_start(root / "plain-any", *off_loopback)


def write_tokens(path: Path, names: tuple[str, ...]) -> dict[str, str]:
    tokens = {name: secrets.token_hex(32) for name in names}
    path.write_text("".join(f"{name} {token}\n" for name, token in tokens.items()))
    path.chmod(0o600)
    return tokens


async def foreign(root: Path, pki: Pki, leases: int = 20) -> dict[str, int]:
    root.mkdir()  # noqa: ASYNC240 (set-up, nothing else runs)
    tokens = write_tokens(root / "callers", ("alice", "bob"))
    agent = Agent(root, (*tls_args(pki, mutual=False), "--set", f"api.token_file={root}/callers"))
    agent.start()
    await agent.ready()
    target = f"127.0.0.1:{agent.tcp_port}"

    def caller(name: str) -> AgentClient:
        credentials = tls_credentials(str(pki.ca))
        return AgentClient(target, token=tokens[name], credentials=credentials, attempts=1)

    count = 0
    async with caller("alice") as alice, caller("bob") as bob:
        ids = [(await alice.admit(**REQUEST)).lease.lease_id for _ in range(leases)]
        for lease_id in ids:
            count += await accepted(bob.release(lease_id))
        await alice.reserve("gang-a", **REQUEST)
        count += await accepted(bob.commit("gang-a"))
        count += await accepted(bob.abort("gang-a"))
        count += await accepted(bob.reserve("gang-a", **REQUEST))
        hidden = sum(x.lease_id in ids for x in (await bob.get_node()).leases)
    agent.stop()
    return {"foreign_release_accepted": count, "foreign_lease_ids_shown": hidden,
            "foreign_calls": leases + 3}  # fmt: skip


def liar_process(env_lease_id: str) -> subprocess.Popen[bytes]:
    """A real process whose environment names ``env_lease_id`` (the forged hint)."""
    env = {**os.environ, "GPUSHARE_LEASE_ID": env_lease_id}
    return subprocess.Popen(["sleep", "60"], env=env)


async def forged_identity(root: Path) -> dict[str, int]:
    """In-process agent (fake GPU only: the liar shows as a client using 16 GiB on the
    victim's device); the real /proc reader; the victim bound to a pod the liar is not in;
    memory policy enforce. Everything done to the victim or the liar is counted."""
    settings = sim_settings(root, **{"janitor.interval_s": 3600, "readiness.interval_s": 3600,
                                     "janitor.memory_policy": "enforce"})  # fmt: skip
    ports = Ports(gpu=FakeGpuBackend.with_gpus(1), mps=FakeMpsManager(),
                  telemetry=[FakeTelemetrySource()], simulated=True)  # fmt: skip
    async with running_app(settings, ports) as app:
        assert app.node is not None and app.control is not None
        request = AdmissionRequest("victim", "t", "t", PriorityClass.BURSTABLE, 8 * GIB, 25,
                                   workload=f"pod:{uuid.uuid4()}")  # fmt: skip
        victim = (await app.node.admit(request)).lease
        assert victim is not None
        liar = liar_process(victim.lease_id)
        try:
            await asyncio.sleep(0.2)  # exec'd, with its environment
            device = app.devices[0].uuid
            ports.mps.connect(device, liar.pid)
            ports.gpu.process_table[device] = [GpuProcess(liar.pid, 16 * GIB, mps=True)]
            for _ in range(3):
                await app.control.readiness.check_once()
                await app.control.janitor.pass_once(dry_run=False)
            await asyncio.sleep(0.5)  # a termination would have landed
            assert await app.events.flush()
            about = [e.kind for e in app.events.since(0) if e.lease_id == victim.lease_id]
            actions = int(app.node.leases[victim.lease_id].state is not LeaseState.ADMITTED)
            actions += int(liar.poll() is not None)
            actions += sum(k not in ("lease.admitted", "lease.identity_mismatch") for k in about)
            mismatches = about.count("lease.identity_mismatch")
        finally:
            liar.kill()
            liar.wait()
    return {"forged_identity_actions": actions, "identity_mismatch_events": mismatches}


def reachable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in path.parents if p != Path("/"))


def world_writable(root: Path) -> list[str]:
    """Files under ``root`` others can write and reach; secrets others can read."""
    found = []
    for path in [root, *root.rglob("*")]:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            continue
        secret = path.name.startswith(("gpushare.db", "token", "callers")) or path.suffix == ".key"
        if mode & stat.S_IWOTH and reachable_by_others(path):
            found.append(f"{path} {stat.S_IMODE(mode):04o}")
        elif secret and mode & stat.S_IROTH and reachable_by_others(path):
            found.append(f"{path} {stat.S_IMODE(mode):04o} (readable secret)")
    return found


def agent_files_open_to_others(root: Path) -> list[str]:
    agents = [sub for sub in root.iterdir() if sub.is_dir() and sub.name not in PKI_DIRS]
    return [f for sub in agents for f in world_writable(sub)]


async def security(root: Path) -> dict[str, Any]:
    pki = make_pki(root / "pki")
    stranger = make_pki(root / "stranger", name="someone else")
    make_client(pki, "other", "other-scheduler")
    result: dict[str, Any] = await unauthenticated(root, pki, stranger)
    result["plaintext_token_accepted"] += plaintext_configs(root)
    result.update(await foreign(root / "owners", pki))
    result.update(await forged_identity(root / "forged"))
    files = await asyncio.to_thread(agent_files_open_to_others, root)
    result["world_writable_files"] = len(files)
    result["world_writable_samples"] = files[:5]
    return result
