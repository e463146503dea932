"""The agent as the DRA driver ``gpushare.io``: the kubelet plugin's :class:`Driver`, over
the node's ledger.

* **Prepare** reads each claim from the API (the kubelet sends only its name and UID),
  takes this node's shares of it, admits a lease per share (:mod:`agent.runtime.claims`)
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
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agent.admission.policy import Rules
from agent.config.dra import DraSettings
from agent.core.errors import GpushareError
from agent.core.lease import Lease
from agent.core.types import Device
from agent.core.units import MIB, parse_bytes
from agent.dra.cdi import (
    CdiDevice,
    CdiDeviceNode,
    CdiMount,
    cdi_id,
    claim_spec,
    remove_spec,
    write_spec,
)
from agent.dra.claims import ClaimError, Share, allocation, metadata, share_config, shares
from agent.dra.port import DRIVER_NAME, ClaimRef, DeviceHealth, Prepared, PreparedDevice
from agent.dra.slices import SlicePublisher
from agent.kubeapi.port import KubeError, NotFound, ResourceApi
from agent.runtime.claims import ShareAsk, ShareLeases, one_share_per_node
from agent.runtime.drainventory import (
    FloorOf,
    Inventory,
    device_health,
    inventory,
    stated_floor,
)
from agent.runtime.events import EventLog
from agent.runtime.node import NodeService
from agent.runtime.section import run_to_end

log = logging.getLogger(__name__)

SHM_PATH = "/dev/shm"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True, slots=True)
class DriverPaths:
    cdi_dir: str
    shm_dir: str = ""  # mounted at /dev/shm in each client container when set


def device_nodes(
    device: Device, exists: Callable[[str], bool] = os.path.exists
) -> list[CdiDeviceNode]:
    """The GPU's device nodes that this host has (none on a simulated node)."""
    index = device.index if device.parent_uuid is None else None
    paths = ([f"/dev/nvidia{index}"] if index is not None else []) + list(CONTROL_NODES)
    return [CdiDeviceNode(p) for p in paths if exists(p)]


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
        self.refresh()

    @property
    def driver_name(self) -> str:
        return DRIVER_NAME

    # -- what is published ------------------------------------------------------------

    def refresh(self) -> None:
        """Publish the devices as the ledger sees them now (no I/O: the publisher writes
        in its own task, only on a change)."""
        views = self._node.views()
        self.inventory = inventory(views, self._rules, self.settings, self._floor_of)
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

    def health(self) -> Sequence[DeviceHealth]:
        return list(self._health)

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
        except ClaimError as exc:
            log.warning("claim %s not prepared: %s", ref, exc)
            return Prepared(error=str(exc))

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
        return claim

    async def _prepare_claim(self, ref: ClaimRef, claim: Mapping[str, object]) -> Prepared:
        mine = shares(claim, self.driver_name, self.node_name)
        if not mine:
            return Prepared()  # nothing of this driver on this node
        one_share_per_node(mine)
        admitted: list[tuple[Share, Lease]] = []
        fresh: list[str] = []
        try:
            for share in mine:
                had = self.leases.live(ref.uid, share)
                lease = await self.admit_share(claim, share)
                admitted.append((share, lease))
                if had is None:
                    fresh.append(lease.lease_id)
            await asyncio.to_thread(self._write_spec, ref.uid, admitted)
        except (ClaimError, GpushareError, OSError) as exc:
            await self._give_back(ref, fresh)
            raise ClaimError(str(exc)) from exc
        except Exception as exc:
            log.exception("preparing claim %s failed", ref)
            await self._give_back(ref, fresh)
            raise ClaimError(
                "the gpushare agent failed to prepare this claim; see its log"
            ) from exc
        return Prepared(devices=tuple(self._prepared(ref.uid, s) for s, _ in admitted))

    async def admit_share(self, claim: Mapping[str, object], share: Share) -> Lease:
        """The share's lease (admitted now, or before), or ClaimError saying why not."""
        uuid = self.inventory.uuid_of.get(share.device)
        if uuid is None:
            raise ClaimError(f"device {share.device} is not published by this node")
        config = share_config(claim, self.driver_name, share.request)
        result = await self.leases.admit(ShareAsk(claim, share, uuid, config))
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

    def _write_spec(self, claim_uid: str, admitted: list[tuple[Share, Lease]]) -> None:
        devices = [self._cdi_device(share, lease) for share, lease in admitted]
        write_spec(self._paths.cdi_dir, claim_uid, claim_spec(claim_uid, devices))

    def _cdi_device(self, share: Share, lease: Lease) -> CdiDevice:
        env, edits = self._node.container_edits(lease)
        mounts = [CdiMount(host, container) for host, container in edits]
        if self._paths.shm_dir:
            mounts.append(CdiMount(self._paths.shm_dir, SHM_PATH))
        device = self._node.devices[lease.device_uuid]
        return CdiDevice(share.key, env, mounts, device_nodes(device))

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
            await asyncio.to_thread(remove_spec, self._paths.cdi_dir, ref.uid)

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        try:
            await run_to_end(self._unprepare_locked(ref), what=f"unprepare of {ref}")
        except (GpushareError, OSError) as exc:
            log.warning("claim %s not unprepared: %s", ref, exc)
            return f"cannot unprepare claim {ref.namespace}/{ref.name}: {exc}"
        return ""
