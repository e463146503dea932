"""The DRA driver, when ``dra.enabled``: wired here so the app only starts and stops it.
Its parts: the kubelet plugin (sockets, registration, Prepare/Unprepare, health), the
ResourceSlice publisher, the claim reconcile, and a refresh that follows the ledger's
device states into the slice and the health stream. The binding answers are no task of
the agent's: the cluster's binding controller asks for them (``AnswerClaim``,
:mod:`agent.claims.binding`); ``dra.binding_conditions`` publishes the conditions on
the slice."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping

from agent.admission.policy import Rules
from agent.aio.tasks import Supervisor
from agent.api.dra_metrics import DraStats
from agent.claims.container import DriverPaths, SharedMemory
from agent.claims.driver import ClaimDriver
from agent.claims.inventory import FloorOf, stated_floor
from agent.claims.reconcile import Reconciler
from agent.claims.shares import claim_leases, claim_uid_of
from agent.claims.specs import KeptSpec, Restored
from agent.config import Settings
from agent.config.fields import setting_bytes
from agent.core.errors import ConfigError
from agent.dra import toolkit
from agent.dra.plugin import DraPluginServer
from agent.dra.port import DRIVER_NAME
from agent.dra.publisher import SlicePublisher
from agent.dra.service import DraService
from agent.kubeapi.port import ResourceApi
from agent.kubeapi.rest import RestKubeApi
from agent.node.events import EventLog
from agent.node.service import NodeService

log = logging.getLogger(__name__)

REFRESH_S = 0.25
FULL_REFRESH_S = 5.0


def resource_api(settings: Settings) -> RestKubeApi:
    d = settings.dra
    if not d.api_server:
        return RestKubeApi.in_cluster(timeout_s=d.api_timeout_s)
    token = ""
    if d.api_token_file:
        with open(d.api_token_file, encoding="utf-8") as f:
            token = f.read().strip()
    return RestKubeApi.from_url(
        d.api_server, token=token, ca_file=d.api_ca, timeout_s=d.api_timeout_s
    )


async def driver_paths(settings: Settings, shm: SharedMemory | None = None) -> DriverPaths:
    """Where the driver reads the host's devices, and what every claim's container gets
    besides its share: the NVIDIA toolkit's libraries and hooks, read once at start (not on
    a simulated node, whose devices have no nodes and no driver)."""
    d, simulated = settings.dra, settings.sim.enabled
    common = None
    if not simulated:
        found = await toolkit.load(
            d.nvidia_ctk, host_root=d.host_root, timeout_s=d.nvidia_ctk_timeout_s
        )
        common = found.edits
    shared_dir = d.shm_dir
    return DriverPaths(
        cdi_dir=d.cdi_dir,
        shm_dir=shared_dir,
        shm_of=(lambda uuid: shm.shm_dir(uuid) or shared_dir) if shm is not None else None,
        dev_root=d.host_dev_root,
        require_nodes=not simulated,
        common=common,
    )


def check_settings(settings: Settings) -> None:
    """What the driver's settings must agree with; a ConfigError names the setting."""
    d = settings.dra
    if not settings.runtime.node_name:
        raise ConfigError("dra.enabled", "needs runtime.node_name (the node's name)")
    setting_bytes("dra.default_memory", d.default_memory)
    if d.clients_per_device > settings.admission.max_clients:
        raise ConfigError(
            "dra.clients_per_device",
            f"{d.clients_per_device} is more than admission.max_clients "
            f"({settings.admission.max_clients}): the scheduler would place shares the "
            "ledger refuses",
        )


class DraDriver:
    def __init__(
        self,
        driver: ClaimDriver,
        server: DraPluginServer,
        publisher: SlicePublisher,
        reconciler: Reconciler,
        api: ResourceApi,
        events: EventLog,
    ) -> None:
        self.driver = driver
        self.server = server
        self.publisher = publisher
        self.reconciler = reconciler
        self._api = api
        self._events = events

    def stats(self) -> DraStats:
        return DraStats(
            registered=self.server.registration.registered,
            prepared=self.driver.prepared,
            prepare_errors=self.driver.prepare_errors,
            unprepared=self.driver.unprepared,
            unprepare_errors=self.driver.unprepare_errors,
            admitted=self.driver.binding_admitted,
            refused=self.driver.binding_refused,
            slice_writes=self.publisher.writes,
            slice_generation=self.publisher.generation,
            reconcile_released=self.reconciler.released,
            prepare_latency=self.server.service.prepare_latency,
        )

    def spawn(self, supervisor: Supervisor) -> None:
        supervisor.spawn("dra-slices", self.publisher.run())
        supervisor.spawn("dra-reconcile", self.reconciler.run())
        supervisor.spawn("dra-refresh", self._refresh_loop())

    async def _refresh_loop(self) -> None:
        """Follow the ledger into the slice and the health stream: at once after any event
        (a lease, a drain, a daemon's life), and every ``FULL_REFRESH_S`` for the states
        that change without one (a daemon that stops answering its probes)."""
        seen, last_full = self._events.last_seq, 0.0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(REFRESH_S)
            now = loop.time()
            if self._events.last_seq != seen or now - last_full >= FULL_REFRESH_S:
                seen, last_full = self._events.last_seq, now
                self.driver.refresh()

    async def stop(self) -> None:
        """Stop serving the kubelet (its sockets go: the kubelet deregisters the driver)."""
        await self.server.stop()

    async def aclose(self) -> None:
        """Close the API client, once the driver's tasks are stopped."""
        await self._api.aclose()


async def start_dra_driver(
    settings: Settings,
    node: NodeService,
    events: EventLog,
    *,
    rules: Rules,
    clock: Callable[[], float],
    floor_of: FloorOf = stated_floor,
    shm: SharedMemory | None = None,
) -> DraDriver | None:
    d = settings.dra
    if not d.enabled:
        return None
    node_name = settings.runtime.node_name
    check_settings(settings)
    api = resource_api(settings)
    publisher = SlicePublisher(
        api, driver=DRIVER_NAME, node=node_name, min_interval_s=d.slice_min_interval_s
    )
    driver = ClaimDriver(
        node,
        events,
        api,
        settings=d,
        rules=rules,
        node_name=node_name,
        paths=await driver_paths(settings, shm),
        shm=shm,
        keep_dir=os.path.join(settings.paths.state_dir, "cdi"),
        publisher=publisher,
        floor_of=floor_of,
    )
    await restore_specs(driver)
    service = DraService(driver)
    driver.on_health = service.health_changed
    server = DraPluginServer(
        service, driver_name=DRIVER_NAME, plugin_dir=d.plugin_dir, registry_dir=d.registry_dir
    )
    await server.start()
    reconciler = Reconciler(driver, api, interval_s=d.reconcile_interval_s, clock=clock)
    log.info(
        "DRA driver %s on node %s: %d device(s) published",
        DRIVER_NAME,
        node_name,
        len(driver.inventory.devices),
    )
    return DraDriver(driver, server, publisher, reconciler, api, events)


async def restore_specs(driver: ClaimDriver) -> Restored:
    """Write again the specs of the claims still prepared (a reboot emptied the CDI
    directory; the kubelet will not ask again): before the plugin serves. The worker
    thread works from a copy of the live leases taken here, on the event loop (the device
    plugin may admit or release meanwhile)."""
    leases = driver.live_leases()

    def live(uid: str) -> list[str]:
        return [x.lease_id for x in claim_leases(leases, uid)]

    def rebuild(kept: KeptSpec) -> Mapping[str, object] | None:
        try:
            return driver.rebuilt(kept, leases)
        except Exception as exc:  # a node missing now: the kept copy goes back as it was
            log.warning("CDI spec of claim %s not rebuilt (%s)", kept.claim_uid, exc)
            return None

    leased = {claim_uid_of(x.request_id) or "" for x in leases if x.held_by_claim} - {""}
    done = await asyncio.to_thread(driver.specs.restore, live, rebuild, leased)
    for what, uids in (
        ("written again", done.written),
        ("dropped", done.dropped),
        ("rebuilt from the ledger", done.rebuilt),
    ):
        if uids:
            log.info("CDI specs %s at start: %d claim(s)", what, len(uids))
    return done
