"""The agent as the DRA driver ``gpushare.io``: the kubelet plugin's :class:`Driver`, over
the node's ledger.

* **Prepare** reads each claim from the API (the kubelet sends only its name and UID),
  takes this node's shares of it, admits a lease per share (:mod:`agent.claims.shares`)
  and writes the claim's CDI spec: the lease's MPS environment, the pipe directory and
  the shared-memory directory, the device nodes. One claim that cannot be prepared fails
  alone; a claim whose shares do not all fit gets none (the ones admitted by that call
  are released).
* **Unprepare** releases the claim's leases and removes its spec. It needs no API call
  and no memory of the Prepare: the leases are found by their request ids in the store.
* **Health** and the **ResourceSlice** follow the ledger's views: a change of a device's
  state republishes (coalesced by the publisher).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from agent.admission.policy import Rules
from agent.aio.section import run_to_end
from agent.claims.container import DriverPaths, SharedMemory, admin_device, share_device
from agent.claims.inventory import (
    FloorOf,
    Inventory,
    device_health,
    inventory,
    stated_floor,
)
from agent.claims.shares import (
    ShareAsk,
    ShareLeases,
    claim_leases,
    one_share_per_request,
    share_of,
)
from agent.claims.specs import KeptSpec, SpecKeeper
from agent.claims.users import ClaimPods, on_mps, with_user
from agent.config.dra import DraSettings
from agent.core.errors import GpushareError, StateError
from agent.core.lease import Lease
from agent.core.types import Device
from agent.core.units import MIB, parse_bytes
from agent.dra.cdi import (
    CdiDevice,
    cdi_id,
    claim_spec,
)
from agent.dra.claims import ClaimError, Share, allocation, metadata, results_here, share_config
from agent.dra.port import DRIVER_NAME, ClaimRef, DeviceHealth, Prepared, PreparedDevice
from agent.dra.publisher import SlicePublisher
from agent.kubeapi.port import KubeError, NotFound, ResourceApi
from agent.mps.shmstate import sole_on_device
from agent.node.events import EventLog
from agent.node.service import NodeService

log = logging.getLogger(__name__)


class ClaimDriver:
    """Prepare, Unprepare and health, for the claims allocated to this node's devices."""

    def __init__(
        self,
        node: NodeService,
        events: EventLog,
        api: ResourceApi,
        *,
        settings: DraSettings,
        rules: Rules,
        node_name: str,
        paths: DriverPaths,
        keep_dir: str,
        shm: SharedMemory | None = None,
        publisher: SlicePublisher | None = None,
        floor_of: FloorOf = stated_floor,
    ) -> None:
        self._node = node
        self._events = events
        self._api = api
        self.settings = settings
        self._rules = rules
        self.node_name = node_name
        self._paths = paths
        self._shm = shm
        self.specs = SpecKeeper(paths.cdi_dir, keep_dir)
        self._publisher = publisher
        self._floor_of = floor_of
        self.on_health: Callable[[], None] = lambda: None  # the health stream's "send again"
        self.leases = ShareLeases(
            node,
            default_memory_bytes=parse_bytes(settings.default_memory) // MIB * MIB,
            default_thread_pct=float(settings.default_thread_pct),
        )
        self.inventory = Inventory((), {}, {})
        self.prepared = self.prepare_errors = self.unprepared = self.unprepare_errors = 0
        self._health: list[DeviceHealth] = []
        self.refused_until: dict[str, float] = {}  # device name -> monotonic deadline
        self.binding_admitted = self.binding_refused = 0  # shares answered (AnswerClaim)
        self.pods = ClaimPods()  # whom a shared claim's processes belong to
        self.refresh()

    @property
    def driver_name(self) -> str:
        return DRIVER_NAME

    # -- what is published ------------------------------------------------------------

    def refresh(self) -> None:
        """Publish the devices as the ledger sees them now (no I/O: the publisher writes
        in its own task, only on a change)."""
        views = self._node.views()
        now_s = time.monotonic()
        self.refused_until = {n: d for n, d in self.refused_until.items() if d > now_s}
        self.inventory = inventory(
            views,
            self._rules,
            self.settings,
            self._floor_of,
            refused_until=self.refused_until,
            now_s=now_s,
            wall_s=time.time(),
        )
        if self._publisher is not None:
            self._publisher.publish(self.inventory.devices)
        health = device_health(views, self.node_name, self.inventory.name_of)
        if health != self._health:
            self._health = health
            self.on_health()

    def note(self, kind: str, message: str, claim: Mapping[str, object], **attrs: str) -> None:
        """An event about a claim (``dra.*``), naming it (by its UID where that is all
        that is known of it)."""
        meta = metadata(claim)
        named = {"claim_uid": str(meta.get("uid") or ""), **attrs}
        if meta.get("name"):
            named["claim"] = f"{meta.get('namespace')}/{meta.get('name')}"
        self._events(kind, message, attrs=named)

    def live_leases(self) -> list[Lease]:
        """The node's live leases (the claims' among them)."""
        return list(self._node.leases.values())

    def bound_now(self) -> dict[str, str]:
        """Lease id -> the pods a shared claim's lease is bound to now (the attributor's)."""
        return self.pods.bound_now(self._node.leases.values())

    def health(self) -> Sequence[DeviceHealth]:
        return list(self._health)

    def refused_device(self, device_name: str) -> None:
        """A share on ``device_name`` was refused at its binding: the device is tainted for
        ``dra.refusal_backoff_s`` so that the scheduler does not pick it again at once."""
        backoff_s = self.settings.refusal_backoff_s
        if backoff_s <= 0:
            return
        self.refused_until[device_name] = time.monotonic() + backoff_s
        self.refresh()
        asyncio.get_running_loop().call_later(backoff_s, self.refresh)

    def remember_claim(self, uid: str, namespace: str, name: str) -> None:
        """Keep the claim's name on the node (:mod:`agent.claims.index`) before a
        lease of it is admitted (the binding answer calls it first); an OSError or
        ValueError means admit nothing. A small write and a rename, once per claim (the
        same name again is a lookup)."""
        self.specs.index.remember(uid, namespace, name)

    # -- Prepare ----------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Prepared]:
        answers = await asyncio.gather(*(self._prepare_one(c) for c in claims))
        failed = sum(1 for a in answers if a.error)
        self.prepared += len(answers) - failed
        self.prepare_errors += failed
        return {c.uid: a for c, a in zip(claims, answers, strict=True)}

    async def _prepare_one(self, ref: ClaimRef) -> Prepared:
        """One claim's answer. Its work runs to its end even if the kubelet gives up on the
        call (a deadline): a lease admitted is then in its spec, for the next Prepare."""
        try:
            claim = await self._read(ref)
            return await run_to_end(self._prepare_locked(ref, claim), what=f"prepare of {ref}")
        except (ClaimError, StateError) as exc:  # StateError: a pod could not be read
            log.warning("claim %s not prepared: %s", ref, exc)
            return Prepared(error=str(exc))
        except Exception:  # one claim's failure is its own, never the call's
            log.exception("preparing claim %s failed", ref)
            return Prepared(error="the gpushare agent failed to prepare this claim; see its log")

    async def _prepare_locked(self, ref: ClaimRef, claim: Mapping[str, object]) -> Prepared:
        async with self.leases.claim_lock(ref.uid):
            return await self._prepare_claim(ref, claim)

    async def _read(self, ref: ClaimRef) -> Mapping[str, object]:
        try:
            claim = await self._api.get_resource_claim(ref.namespace, ref.name)
        except NotFound as exc:
            raise ClaimError(f"claim {ref.namespace}/{ref.name} does not exist") from exc
        except KubeError as exc:
            raise ClaimError(f"cannot read claim {ref.namespace}/{ref.name}: {exc}") from exc
        if metadata(claim).get("uid") != ref.uid:
            raise ClaimError(f"claim {ref.namespace}/{ref.name} was replaced (UID differs)")
        if allocation(claim) is None:
            raise ClaimError(f"claim {ref.namespace}/{ref.name} is not allocated")
        self.pods.saw(claim)
        return claim

    async def _prepare_claim(self, ref: ClaimRef, claim: Mapping[str, object]) -> Prepared:
        """Every check first (the results of this driver here, a share per request, each
        share's device and configuration), then the admissions: a claim refused for what
        it says never holds a lease."""
        found = results_here(claim, self.driver_name, self.node_name)
        if not found:
            raise ClaimError(
                f"claim {ref.namespace}/{ref.name} has no {self.driver_name} device allocated "
                f"on node {self.node_name}"
            )
        mine = [s for s in found if not s.admin]
        one_share_per_request(mine)
        asks = [self.ask(claim, share) for share in mine]
        admin = [(s, self._device(s)) for s in found if s.admin]
        if any(self.leases.live(ref.uid, a.share) is None for a in asks):
            asks = await self.with_user(claim, asks)  # a lease to admit: whose is it?
        admitted: list[tuple[Share, Lease]] = []
        fresh: list[str] = []
        try:
            # its name, on the node before its first lease: the reconcile reads it by name
            self.specs.index.remember(ref.uid, ref.namespace, ref.name)
            for ask in asks:
                had = self.leases.live(ref.uid, ask.share)
                lease = await self._admit(ask)
                admitted.append((ask.share, lease))
                if had is None:
                    fresh.append(lease.lease_id)
            await self._claim_shm([x for _, x in admitted])
            if admin:  # its record is synced to the disk: off the loop
                await asyncio.to_thread(self._write_spec, ref.uid, admitted, admin)
            else:  # a few syscalls, no fsync: cheaper here than a thread hop
                self._write_spec(ref.uid, admitted, admin)
        except (ClaimError, GpushareError, OSError) as exc:
            await self._give_back(ref, fresh)
            raise ClaimError(str(exc)) from exc
        except Exception as exc:
            log.exception("preparing claim %s failed", ref)
            await self._give_back(ref, fresh)
            raise ClaimError(
                "the gpushare agent failed to prepare this claim; see its log"
            ) from exc
        shares_done = [s for s, _ in admitted] + [s for s, _ in admin]
        return Prepared(devices=tuple(self._prepared(ref.uid, s) for s in shares_done))

    async def _claim_shm(self, leases: list[Lease]) -> None:
        """Each share's device's shared memory made its trust domain's before a container
        is handed it (emptied, its servers shut down, when it served another domain)."""
        if self._shm is None:
            return
        live = list(self._node.leases.values())
        for lease in leases:
            sole = sole_on_device(lease, live)
            await self._shm.claim_shm(lease.device_uuid, lease.trust_domain, sole=sole)

    def _device(self, share: Share) -> Device:
        uuid = self.inventory.uuid_of.get(share.device)
        device = self._node.devices.get(uuid) if uuid is not None else None
        if device is None:
            raise ClaimError(f"device {share.device} is not published by this node")
        return device

    def ask(self, claim: Mapping[str, object], share: Share) -> ShareAsk:
        """What admitting ``share`` asks of the ledger, every part checked (ClaimError)."""
        device = self._device(share)
        config = share_config(claim, self.driver_name, share.request)
        return ShareAsk(claim, share, device.uuid, config)

    async def with_user(
        self, claim: Mapping[str, object], asks: Sequence[ShareAsk]
    ) -> list[ShareAsk]:
        """``asks`` with the user of the claim's pods (:mod:`agent.claims.users`): read
        where a share is on an MPS device (one daemon a GPU, one server a user)."""
        if not on_mps((a.device_uuid for a in asks), self._node.devices):
            return list(asks)
        rule = self._rules.one_user_per_device
        required = rule and self.settings.require_run_as_user
        told = await with_user(self._api, claim, asks, rule=rule, required=required)
        self.pods.checked(claim)
        return told

    def user_rule_on(self, leases: Sequence[Lease]) -> bool:
        """Whether one user a server holds for these leases' devices (an MPS device, the
        daemons not multi-user)."""
        held = (x.device_uuid for x in leases)
        return self._rules.one_user_per_device and on_mps(held, self._node.devices)

    async def admit_ask(self, ask: ShareAsk) -> Lease:
        """The share's lease (admitted now, or before), or ClaimError saying why not."""
        return await self._admit(ask)

    async def _admit(self, ask: ShareAsk) -> Lease:
        result = await self.leases.admit(ask)
        if not result.decision.admitted or result.lease is None:
            reason = result.decision.reason.value if result.decision.reason else "REFUSED"
            raise ClaimError(f"{reason}: {result.decision.message}")
        return result.lease

    async def _give_back(self, ref: ClaimRef, lease_ids: list[str]) -> None:
        for lease_id in lease_ids:
            try:
                await self._node.release(lease_id)
            except GpushareError as exc:
                log.warning("lease %s of claim %s not given back: %s", lease_id, ref, exc)

    def _prepared(self, claim_uid: str, share: Share) -> PreparedDevice:
        return PreparedDevice(
            request_names=(share.request,),
            pool_name=self.node_name,
            device_name=share.device,
            cdi_device_ids=(cdi_id(claim_uid, share.key),),
            share_id=share.share_id or None,
        )

    def _write_spec(
        self, claim_uid: str, admitted: list[tuple[Share, Lease]], admin: list[tuple[Share, Device]]
    ) -> None:
        """Build the claim's CDI devices (reading the host's /dev and /proc now) and write
        its spec, kept for a restart. Without ``admin`` devices it fsyncs nothing and runs
        on the event loop (cheaper than a thread hop); with them its record is synced to
        the disk, so the caller runs it in a worker thread."""
        cdi = [self._cdi_device_of(s.key, x) for s, x in admitted]
        cdi += [admin_device(s.key, device, self._paths) for s, device in admin]
        kept = KeptSpec(
            claim_uid,
            tuple(x.lease_id for _, x in admitted),
            claim_spec(claim_uid, cdi),
            tuple((s.key, device.uuid) for s, device in admin),
        )
        self.specs.write(kept)

    def rebuilt(self, kept: KeptSpec, leases: Sequence[Lease]) -> Mapping[str, object] | None:
        """The claim's spec as this agent writes it now, from its live ``leases`` and kept
        ``adminAccess`` devices (a spec of the last release gets the current layout);
        None where it cannot be built (the kept copy is then written as it was)."""
        uid = kept.claim_uid
        cdi = [self._cdi_device_of(share_of(x.request_id), x) for x in claim_leases(leases, uid)]
        for key, device_uuid in kept.admin:
            device = self._node.devices.get(device_uuid)
            if device is None:
                return None
            cdi.append(admin_device(key, device, self._paths))
        return claim_spec(uid, cdi) if cdi else None

    def _cdi_device_of(self, key: str, lease: Lease) -> CdiDevice:
        return share_device(self._node, self._paths, key, lease)

    # -- Unprepare --------------------------------------------------------------------

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        answers = await asyncio.gather(*(self._unprepare_one(c) for c in claims))
        failed = sum(1 for a in answers if a)
        self.unprepared += len(answers) - failed
        self.unprepare_errors += failed
        return {c.uid: a for c, a in zip(claims, answers, strict=True)}

    async def _unprepare_locked(self, ref: ClaimRef) -> None:
        async with self.leases.claim_lock(ref.uid):
            await self.leases.release_claim(ref.uid, "unprepared by the kubelet")
            self.specs.remove(ref.uid)  # unlinks: no thread hop
            self.specs.index.forget(ref.uid)

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        try:
            await run_to_end(self._unprepare_locked(ref), what=f"unprepare of {ref}")
        except (GpushareError, OSError) as exc:
            log.warning("claim %s not unprepared: %s", ref, exc)
            return f"cannot unprepare claim {ref}: {exc}"
        except Exception:  # one claim's failure is its own, never the call's
            log.exception("unprepare of claim %s failed", ref)
            return "the gpushare agent failed to unprepare this claim; see its log"
        return ""
