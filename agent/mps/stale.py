"""What is stale on a node's MPS daemons, and what to do about it. Pure: facts in, actions out.

The janitor gathers the facts (MPS client lists, process states, the lease each process
belongs to, faults) and applies the actions; this module only decides, so every rule is
tested with tables:

- a client PID still listed by MPS whose process is gone or a zombie: ``terminate_client``,
  once (a PID already terminated is never asked for again);
- a client that belongs to no live lease: reported once, or terminated (policy);
- a ready lease whose processes have all exited, for longer than the grace period:
  released;
- a device whose server hit a fatal fault (``server.log``) or an Xid: its leases fail, its
  remaining clients are terminated and its servers shut down, so MPS can start afresh;
- a lease whose processes use more device memory than its limit: a violation, reported
  once while it lasts, and under policy ``enforce`` its clients are terminated: only those
  its cgroup says are its own (``by_cgroup``). A client attributed by its
  ``GPUSHARE_LEASE_ID`` hint alone (a lease bound to no workload) is never terminated for
  a lease's memory, since any process can carry any lease's id.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.core.lease import Lease, LeaseState
from agent.core.mpsstate import MpsDaemonState
from agent.core.units import format_bytes


class ProcessState(enum.StrEnum):
    ALIVE = "alive"
    ZOMBIE = "zombie"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class ProcessFact:
    state: ProcessState
    lease_id: str | None = None  # the lease it belongs to (agent.core.identity.attribute)
    by_cgroup: bool = False  # its cgroup matches that lease's workload (else: the hint only)


class ActionKind(enum.StrEnum):
    TERMINATE = "terminate"
    REPORT_UNKNOWN = "report-unknown"
    RELEASE = "release"
    FAIL_DEVICE = "fail-device"
    MEMORY_VIOLATION = "memory-violation"


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    description: str
    device_uuid: str | None = None
    lease_ids: tuple[str, ...] = ()
    clients: tuple[tuple[int, int], ...] = ()  # (server PID, client PID)
    server_pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Facts:
    now: float
    daemons: Sequence[MpsDaemonState]
    leases: Sequence[Lease]
    processes: Mapping[int, ProcessFact]
    faults: Mapping[str, str] = field(default_factory=dict)  # device -> what happened
    memory_used: Mapping[str, int] = field(default_factory=dict)  # lease -> bytes (NVML)


@dataclass(frozen=True, slots=True)
class Memory:
    """What the janitor carries from one pass to the next."""

    terminated: frozenset[tuple[str, int]] = frozenset()  # (device, client PID)
    reported: frozenset[int] = frozenset()  # unknown client PIDs already reported
    exited_since: Mapping[str, float] = field(default_factory=dict)  # lease -> first seen
    violating: frozenset[str] = frozenset()  # leases over their memory limit


@dataclass(frozen=True, slots=True)
class Policy:
    unknown_clients: str = "report"  # or "terminate"
    exit_grace_s: float = 60.0
    memory: str = "report"  # or "enforce"
    claim_memory: str = "report"  # the same, for a DRA claim's leases

    def memory_of(self, lease: Lease) -> str:
        return self.claim_memory if lease.held_by_claim else self.memory


def clients_on(
    daemons: Sequence[MpsDaemonState], device_uuid: str, keep: Callable[[int], bool]
) -> tuple[tuple[int, int], ...]:
    """(server PID, client PID) of the device's MPS clients that ``keep`` selects."""
    return tuple(
        (server.pid, pid)
        for daemon in daemons
        if daemon.device_uuid == device_uuid
        for server in daemon.servers
        for pid in server.client_pids
        if keep(pid)
    )


def plan(facts: Facts, memory: Memory, policy: Policy) -> tuple[list[Action], Memory]:
    """This pass's actions and what to remember for the next, in a stable order."""
    faulted = [d for d in facts.daemons if d.device_uuid in facts.faults]
    actions = [_fail_device(d, facts) for d in faulted]
    skip = {d.device_uuid for d in faulted}
    client_actions, terminated, reported = _clients(facts, memory, policy, skip)
    actions += client_actions
    exits, exited_since = _exited(facts, memory, policy, skip)
    actions += exits
    over, violating = _memory(facts, memory, policy)
    actions += over
    return actions, Memory(terminated, reported, exited_since, violating)


def _fail_device(daemon: MpsDaemonState, facts: Facts) -> Action:
    uuid = daemon.device_uuid
    leases = tuple(x.lease_id for x in facts.leases if x.device_uuid == uuid)
    clients = clients_on([daemon], uuid, lambda _pid: True)
    servers = tuple(s.pid for s in daemon.servers)
    return Action(
        ActionKind.FAIL_DEVICE,
        f"device {uuid}: {facts.faults[uuid]}: fail {len(leases)} lease(s), terminate "
        f"{len(clients)} client(s), shut down {len(servers)} server(s)",
        device_uuid=uuid,
        lease_ids=leases,
        clients=clients,
        server_pids=servers,
    )


def _clients(
    facts: Facts, memory: Memory, policy: Policy, skip: set[str]
) -> tuple[list[Action], frozenset[tuple[str, int]], frozenset[int]]:
    live = {x.lease_id for x in facts.leases}
    actions: list[Action] = []
    terminated, reported = set(memory.terminated), set(memory.reported)
    listed: set[tuple[str, int]] = set()
    for daemon in facts.daemons:
        if daemon.device_uuid in skip:
            continue
        for server in daemon.servers:
            for pid in server.client_pids:
                key = (daemon.device_uuid, pid)
                listed.add(key)
                if key in terminated:
                    continue
                fact = facts.processes.get(pid, ProcessFact(ProcessState.GONE))
                action = _client_action(daemon.device_uuid, server.pid, pid, fact, live, policy)
                if action is None:
                    continue
                if action.kind is ActionKind.REPORT_UNKNOWN:
                    if pid in reported:
                        continue
                    reported.add(pid)
                else:
                    terminated.add(key)
                actions.append(action)
    # Forget PIDs MPS no longer lists, so a reused PID is judged afresh.
    return actions, frozenset(terminated & listed), frozenset(reported & {p for _, p in listed})


def _client_action(
    device: str, server: int, pid: int, fact: ProcessFact, live: set[str], policy: Policy
) -> Action | None:
    if fact.state is not ProcessState.ALIVE:
        kind, why = ActionKind.TERMINATE, f"process {fact.state.value}"
    elif fact.lease_id in live:
        return None
    elif policy.unknown_clients == "terminate":
        kind, why = ActionKind.TERMINATE, "it belongs to no lease"
    else:
        kind, why = ActionKind.REPORT_UNKNOWN, "it belongs to no lease"
    verb = "terminate" if kind is ActionKind.TERMINATE else "report"
    return Action(
        kind,
        f"{verb} client {pid} of server {server} on {device}: {why}",
        device_uuid=device,
        clients=((server, pid),),
    )


def _exited(
    facts: Facts, memory: Memory, policy: Policy, skip: set[str]
) -> tuple[list[Action], dict[str, float]]:
    running = {
        fact.lease_id
        for fact in facts.processes.values()
        if fact.state is ProcessState.ALIVE and fact.lease_id
    }
    actions: list[Action] = []
    since: dict[str, float] = {}
    for lease in facts.leases:
        if lease.state is not LeaseState.READY or lease.device_uuid in skip:
            continue
        if lease.held_by_claim:  # its container may restart: the claim says when it ends
            continue
        own_alive = any(
            facts.processes.get(p, ProcessFact(ProcessState.GONE)).state is ProcessState.ALIVE
            for p in lease.client_pids
        )
        if own_alive or lease.lease_id in running:
            continue
        first = memory.exited_since.get(lease.lease_id, facts.now)
        since[lease.lease_id] = first
        if facts.now - first >= policy.exit_grace_s:
            actions.append(
                Action(
                    ActionKind.RELEASE,
                    f"release lease {lease.lease_id}: all its processes exited "
                    f"{facts.now - first:.0f} s ago",
                    device_uuid=lease.device_uuid,
                    lease_ids=(lease.lease_id,),
                )
            )
    return actions, since


def _memory(facts: Facts, memory: Memory, policy: Policy) -> tuple[list[Action], frozenset[str]]:
    actions: list[Action] = []
    violating: set[str] = set()
    for lease in facts.leases:
        used = facts.memory_used.get(lease.lease_id)
        if used is None or used <= lease.memory_bytes:
            continue
        violating.add(lease.lease_id)
        if lease.lease_id not in memory.violating:  # else: acted on already, still over
            actions.append(_violation(lease, used, facts, policy))
    return actions, frozenset(violating)


def _violation(lease: Lease, used: int, facts: Facts, policy: Policy) -> Action:
    own = {pid: f for pid, f in facts.processes.items() if f.lease_id == lease.lease_id}
    verified = {pid for pid, f in own.items() if f.by_cgroup}
    clients = clients_on(facts.daemons, lease.device_uuid, verified.__contains__)
    hinted = clients_on(facts.daemons, lease.device_uuid, lambda p: p in own and p not in verified)
    said = (
        f"lease {lease.lease_id} uses {format_bytes(used)} of device memory, over its "
        f"limit {format_bytes(lease.memory_bytes)}"
    )
    enforce = policy.memory_of(lease) == "enforce"
    if enforce and (clients or not hinted):
        said += f": terminate its {len(clients)} client(s)"
    if enforce and hinted:
        said += (
            f"; {len(hinted)} client(s) known by their GPUSHARE_LEASE_ID only (a lease bound "
            "to no workload) are not terminated"
        )
    return Action(
        ActionKind.MEMORY_VIOLATION,
        said,
        device_uuid=lease.device_uuid,
        lease_ids=(lease.lease_id,),
        clients=clients if enforce else (),
    )
