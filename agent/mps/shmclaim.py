"""One device's shared memory as its supervisor keeps it (:mod:`agent.mps.shm`): what the
daemon just started or adopted gives its servers at /dev/shm, and the claim that makes it
ready for a container of a trust domain (another domain than the last: servers shut down,
directory emptied, domain recorded, defaults set again; a legacy daemon with no other
lease on its device: quit, and its successor awaited)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol

from agent.core.errors import MpsControlError, MpsError
from agent.core.types import Device
from agent.mps import daemon as proc
from agent.mps import shm
from agent.mps import shmstate as st
from agent.mps.control import MpsControlClient
from agent.mps.limits import DaemonPaths
from agent.mps.options import SupervisorOptions
from agent.mps.shmstate import Isolation, ShmState

log = logging.getLogger(__name__)


class Keeper(Protocol):
    """What the device's memory reads of the daemon's keeper
    (:class:`agent.mps.supervisor.DaemonSupervisor`)."""

    device: Device
    options: SupervisorOptions
    paths: DaemonPaths
    client: MpsControlClient

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def up(self) -> bool: ...

    @property
    def process(self) -> proc.DaemonProcess | None: ...

    def emit(self, kind: str, message: str, **attrs: str) -> None: ...

    async def apply_defaults(self) -> None: ...

    async def refresh_servers(self) -> None: ...


class DeviceMemory:
    def __init__(self, supervisor: Keeper, isolation: Isolation) -> None:
        self._s = supervisor
        self.isolation = isolation  # whether the daemons this process starts get their own
        self.state = ShmState("off", reason=st.NO_ROOT)
        self.renewing = False  # the daemon is being quit to get memory of its own
        self._claiming = asyncio.Lock()
        self._renew_refused = ""  # why a legacy daemon is no longer renewed

    async def spawn(self) -> proc.DaemonProcess:
        """Start the device's daemon with the shared memory this process can give it."""
        s = self._s
        return await shm.spawn(s.options, s.env, s.paths, isolation=self.isolation)

    def why_down(self, reason: str) -> str:
        """Why the daemon went down, as the health loop tells it."""
        return f"{reason}: quit to get shared memory of its own" if self.renewing else reason

    def release(self) -> None:
        """The daemon was quit here: its tmpfs goes with it (mounted by this process)."""
        if self._s.options.shm.enabled and os.geteuid() == 0:
            shm.release_dir(self._s.options.shm, self._s.device.uuid)

    def judge(self) -> None:
        """What the daemon just started or adopted gives its servers at /dev/shm."""
        s = self._s
        assert s.process is not None
        options, pid, uuid = s.options.shm, s.process.pid, s.device.uuid
        if not options.enabled:
            self.state = ShmState("off", reason=st.NO_ROOT)
            return
        self.state = st.judge(
            options,
            uuid,
            pid=pid,
            start=st.start_time(pid),
            record=st.read_record(st.record_path(s.paths.base)),
            seen=st.sees(pid, options.device_dir(uuid)),
        )
        state = self.state
        if state.kind == "own":
            log.info("MPS daemon %d of %s: /dev/shm is %s", pid, uuid, state.directory)
            s.emit("mps.shm_own", f"servers of daemon {pid} use {state.directory}")
        elif state.kind == "mismatch":
            log.error("MPS daemon %d of %s: %s; nothing is handed out", pid, uuid, state.reason)
            s.emit("mps.shm_mismatch", state.reason)
        else:
            log.warning(
                "MPS daemon %d of %s shares its starter's /dev/shm (%s): %s",
                pid,
                uuid,
                state.kind,
                state.reason,
            )
            s.emit("mps.shm_shared", state.reason, state=state.kind)

    @property
    def directory(self) -> str:
        """The directory this device's clients get at /dev/shm; "" when its servers have
        none of their own (the caller's shared directory then)."""
        return self.state.directory if self.state.kind == "own" else ""

    async def claim(self, trust_domain: str, *, sole: bool = False) -> str:
        """Make the device's shared memory ready for a container of ``trust_domain`` and
        return it ("" when the servers have none of their own: the caller's shared one).

        Another trust domain than the directory's last: the servers are shut down, the
        directory emptied, the domain recorded, the defaults set again and read back. A
        legacy daemon is quit and started again in its namespace when ``sole`` (no other
        live lease on the device). Raises :class:`MpsError` when the daemon is down, its
        shared memory contradicts its record, or a step fails: nothing is handed out."""
        s = self._s
        if not s.options.shm.enabled:
            return ""
        async with self._claiming:
            if not s.up:
                raise MpsError(f"no running MPS daemon for device {s.device.uuid}")
            if self.state.kind == "legacy" and sole and not self._renew_refused:
                await self._renew()
            if self.state.kind == "mismatch":
                raise MpsError(f"shared memory of {s.device.uuid}: {self.state.reason}")
            if self.state.kind != "own":
                return ""
            if st.domain_of(s.options.shm, s.device.uuid) != trust_domain:
                await _whole(self._change_domain(trust_domain))
            return self.state.directory

    async def _change_domain(self, trust_domain: str) -> None:
        s = self._s
        options, uuid, directory = s.options.shm, s.device.uuid, self.state.directory
        before = st.domain_of(options, uuid)
        servers = await self._shut_down_servers()
        try:
            removed = await asyncio.to_thread(st.empty, directory)
        except OSError as exc:
            raise MpsError(f"cannot empty {directory}: {exc}") from exc
        await s.apply_defaults()
        await s.refresh_servers()
        try:  # last: a step that failed before leaves the old domain, so it is done again
            await asyncio.to_thread(st.set_domain, options, uuid, trust_domain)
        except OSError as exc:
            raise MpsError(f"cannot record the trust domain of {uuid}: {exc}") from exc
        message = (
            f"{directory} emptied ({removed} entries) for trust domain "
            f"{trust_domain!r} (before: {before or 'none'}); {servers} server(s) shut down, "
            "defaults set again"
        )
        log.info("MPS shared memory of %s: %s", uuid, message)
        s.emit("mps.shm_domain_changed", message, servers=str(servers))

    async def _shut_down_servers(self) -> int:
        client, s = self._s.client, self._s
        pids = await client.server_pids()
        for pid in pids:
            with contextlib.suppress(MpsControlError):  # gone meanwhile
                await client.shutdown_server(pid, force=True)
        deadline = time.monotonic() + s.options.quit_timeout_s + 1.0
        while pids and await client.server_pids():
            if time.monotonic() > deadline:
                raise MpsError(
                    f"servers of {s.device.uuid} still run after shutdown_server -f: its "
                    "shared memory is not handed to another trust domain"
                )
            await asyncio.sleep(0.05)
        return len(pids)

    async def _renew(self) -> None:
        """Quit a legacy daemon and wait until the health loop has its successor (started
        here, or by the MPS host) and knows what that one sees."""
        s = self._s
        process, uuid, o = s.process, s.device.uuid, s.options
        assert process is not None
        log.info("MPS daemon %d of %s: legacy and no lease left: renewing", process.pid, uuid)
        self.renewing = True
        try:
            with contextlib.suppress(MpsError):
                await s.client.quit(o.quit_timeout_s)
            await proc.stop_ladder(
                process,
                quit_sent=True,
                quit_wait_s=o.quit_timeout_s + 1.0,
                term_wait_s=2.0,
                device=uuid,
            )
            wait_s = o.quit_timeout_s + o.start_timeout_s + o.backoff_max_s + 5.0
            deadline = time.monotonic() + wait_s
            while not (s.up and s.process is not None and s.process.pid != process.pid):
                if time.monotonic() > deadline:
                    raise MpsError(
                        f"the MPS daemon of {uuid} did not come back within {wait_s:g} s "
                        "after it was quit to get shared memory of its own"
                    )
                await asyncio.sleep(0.05)
        finally:
            self.renewing = False
        if self.state.kind == "legacy":  # its starter is of an earlier release
            self._renew_refused = self.state.reason
            log.warning(
                "MPS daemon of %s started again without shared memory of its own: not "
                "renewed again (is `gpushare mps host` of an earlier release?)",
                uuid,
            )


async def _whole(change: Coroutine[Any, Any, None]) -> None:
    """Run a domain change to its end even if the caller is cancelled meanwhile: the
    caller still waits for it (under the claim's lock, so no other claim sees the
    directory half emptied), then is cancelled."""
    task = asyncio.ensure_future(change)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise
