"""The node as the API sees it: the App's views plus the NodeService's operations."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agent.control.janitor import Janitor
from agent.core.errors import GpushareError
from agent.core.learning import ProgressAnswer, RetrainAnswer
from agent.core.lease import Lease
from agent.core.snapshot import NodeSnapshot
from agent.core.types import AdmissionRequest, AdmitResult, BatchResult, Device
from agent.learning.learner import NodeLearning
from agent.node.service import NodeService


class NodeFacade:
    """Implements ``agent.api.ports.NodeApi``; the service exists once the node started."""

    def __init__(
        self,
        snapshot: Callable[..., NodeSnapshot],  # App.snapshot
        service: Callable[[], NodeService | None],
        janitor: Callable[[], Janitor | None] = lambda: None,
        learning: Callable[[], NodeLearning | None] = lambda: None,
    ) -> None:
        self._snapshot = snapshot
        self._service = service
        self._janitor = janitor
        self._learning = learning
        self.closing: str | None = None  # why new leases are refused (a draining stop)

    def snapshot(self, *, ledger_only: bool = False) -> NodeSnapshot:
        return self._snapshot(ledger_only=ledger_only)

    @property
    def _node(self) -> NodeService:
        service = self._service()
        if service is None:
            raise GpushareError("the agent is still starting")
        return service

    def device_index(self, device_uuid: str) -> int:
        device = self._node.devices.get(device_uuid)
        return device.index if device is not None else 0

    def device(self, device_uuid: str) -> Device | None:
        return self._node.devices.get(device_uuid)

    def _open(self) -> NodeService:
        if self.closing is not None:
            raise GpushareError(self.closing)  # UNAVAILABLE: the scheduler goes elsewhere
        return self._node

    async def admit(
        self, request: AdmissionRequest, *, gang_id: str | None = None, ttl_s: float | None = None
    ) -> AdmitResult:
        return await self._open().admit(request, gang_id=gang_id, ttl_s=ttl_s)

    async def admit_batch(self, requests: Sequence[AdmissionRequest]) -> BatchResult:
        return await self._open().admit_batch(requests)

    async def explain(self, request: AdmissionRequest) -> AdmitResult:
        return await self._node.explain(request)

    async def commit(self, gang_id: str, *, owner: str | None = None) -> list[Lease]:
        return await self._node.commit(gang_id, owner=owner)

    async def abort(self, gang_id: str, *, owner: str | None = None) -> list[Lease]:
        return await self._node.abort(gang_id, owner=owner)

    async def release(self, lease_id: str, *, owner: str | None = None) -> Lease:
        return await self._node.release(lease_id, owner=owner)

    def owner_of(self, lease_id: str) -> str:
        service = self._service()
        return service.owner_of(lease_id) if service is not None else ""

    async def drain(self, device_uuid: str | None, reason: str) -> list[str]:
        return await self._node.drain(device_uuid or None, reason)

    async def undrain(self, device_uuid: str | None) -> list[str]:
        return await self._node.undrain(device_uuid or None)

    async def clear_stale(self, *, dry_run: bool) -> list[str]:
        janitor = self._janitor()
        if janitor is None:
            return await self._node.clear_stale(dry_run=dry_run)
        return await janitor.pass_once(dry_run=dry_run)

    @property
    def _loop(self) -> NodeLearning:
        learning = self._learning()
        if learning is None:
            raise GpushareError("the agent is still starting")
        return learning

    async def report_progress(
        self, lease_id: str, units_done: float, *, owner: str | None = None
    ) -> ProgressAnswer:
        return self._loop.recorder.report(lease_id, units_done, owner=owner)

    async def retrain_estimator(self) -> RetrainAnswer:
        return await self._loop.learner.retrain()
