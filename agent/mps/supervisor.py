"""Keep one device's MPS control daemon healthy, with its defaults, for as long as the agent
runs.

The health loop probes the daemon every ``probe_interval_s`` (reading its default thread
percentage through the front-end), reads the defaults back and re-applies them when they
drifted (anyone who reaches the pipe directory can change them: a security event), and
lists its servers and clients. A daemon that exits, or misses ``hung_after_probes`` probes
in a row, is killed and started again after an exponential backoff, and its defaults are
applied again every time. Control and server log lines become events.
With ``mps.shm_root`` it is started with shared memory of its own, kept by
:class:`agent.mps.shmclaim.DeviceMemory` (``memory``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from agent.core.errors import MpsControlError, MpsError
from agent.core.mpsstate import MpsDaemonState, MpsServerState
from agent.core.types import Device
from agent.mps import daemon as proc
from agent.mps.control import MpsControlClient
from agent.mps.limits import DAEMON_DEVICE_ORDINAL, DaemonPaths, daemon_environment
from agent.mps.logfollow import LogFollower
from agent.mps.logs import classify, parse_line
from agent.mps.options import DaemonDefaults, SupervisorOptions
from agent.mps.pipes import PipePermissionError, PipeWatch, resolve_access
from agent.mps.port import ControlChannel, EventSink
from agent.mps.shmclaim import DeviceMemory
from agent.mps.shmstate import OFF, Isolation

log = logging.getLogger(__name__)

HEALTHY_RESET_S = 30.0  # a daemon answering this long resets the restart backoff


ChannelFactory = Callable[[Device, Mapping[str, str]], ControlChannel]
ExclusiveModeFn = Callable[[Device, bool], Awaitable[None]]


class DaemonSupervisor:
    def __init__(
        self,
        device: Device,
        options: SupervisorOptions,
        defaults: DaemonDefaults,
        *,
        channel_factory: ChannelFactory,
        emit: EventSink,
        set_exclusive: ExclusiveModeFn,
        isolation: Isolation = OFF,
    ) -> None:
        self.device = device
        self.options = options
        self.defaults = defaults
        self.paths = DaemonPaths(options.root_dir, device.uuid)
        self.env = daemon_environment(device, self.paths)
        self.client = MpsControlClient(channel_factory(device, self.env))
        self._emit = emit
        self._set_exclusive = set_exclusive
        self._process: proc.DaemonProcess | None = None
        self._logs = [
            LogFollower(f"{self.paths.log_dir}/{n}") for n in ("control.log", "server.log")
        ]
        self._failures = 0
        self._up_since: float | None = None
        self._read_pct: float | None = None
        self._read_limit: int | None = None
        self._servers: tuple[MpsServerState, ...] = ()
        self.restarts = 0
        self.drift_total = 0
        self.answering = True
        self.pipes: PipeWatch | None = None
        self.detail = "not started"
        self.memory = DeviceMemory(self, isolation)

    # -- events ----------------------------------------------------------------------------

    def emit(self, kind: str, message: str, **attrs: str) -> None:
        self._emit(kind, message, device_uuid=self.device.uuid, attrs=attrs)

    def follow_logs(self) -> None:
        for follower in self._logs:
            for raw in follower.read_new_lines():
                event = classify(parse_line(raw))
                if event is not None:
                    self._emit(
                        event.kind, event.message, device_uuid=self.device.uuid, attrs=event.attrs
                    )

    # -- start -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Bring the daemon up with its defaults; raise :class:`MpsError` if it cannot be."""
        pipes = self._pipe_watch()
        try:
            pipes.prepare()
        except OSError as exc:
            raise MpsError(f"cannot prepare {self.paths.base}: {exc}") from exc
        self._skip_old_log_lines()
        await self._set_exclusive(self.device, True)
        holder = proc.lock_holder(self.paths.pipe_dir)
        if not holder and self.options.by_host:
            holder = await self._wait_for_host()
        if holder:
            self._process = proc.DaemonProcess(holder)
        else:
            removed = proc.clear_stale_files(self.paths.pipe_dir)
            if removed:
                self.emit(
                    "mps.stale_files_removed", f"removed {', '.join(removed)} of a dead daemon"
                )
            self._process = await self.memory.spawn()
        try:
            await self._wait_answering()
            pipes.check_start()
            await self.apply_defaults()
        except (MpsError, PipePermissionError):
            await self._process.kill()
            raise
        self.memory.judge()
        self._up_since = time.monotonic()
        self.detail = ""
        self.answering = True
        pid = self._process.pid
        if self._process.adopted:
            self.emit("mps.daemon_adopted", f"adopted live control daemon {pid}", pid=str(pid))
        else:
            self.emit("mps.daemon_started", f"control daemon {pid} up", pid=str(pid))

    async def _wait_for_host(self) -> int:
        deadline = time.monotonic() + self.options.start_timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            if holder := proc.lock_holder(self.paths.pipe_dir):
                return holder
        raise MpsError(
            f"no control daemon in {self.paths.pipe_dir} within "
            f"{self.options.start_timeout_s:g} s: with mps.launch 'host' it is started by "
            "`gpushare mps host`, which must run on this node"
        )

    def _pipe_watch(self) -> PipeWatch:
        if self.pipes is None:
            access = resolve_access(self.options.client_gid, self.options.client_group)
            self.pipes = PipeWatch(self.paths, access)
        return self.pipes

    def check_pipes(self) -> None:
        """Compare the pipe and log directories and files with what they must be; every
        change is a SECURITY event and counts as a violation."""
        if self.pipes is None:
            return
        try:
            problems = self.pipes.check()
        except OSError as exc:
            problems = [f"cannot check {self.paths.pipe_dir}: {exc}"]
            self.pipes.violations_total += 1
        for problem in problems:
            log.warning("SECURITY MPS pipe permissions on %s: %s", self.device.uuid, problem)
            self.emit("mps.pipe_permissions", problem)

    def _skip_old_log_lines(self) -> None:
        for follower in self._logs:
            follower.read_new_lines()

    async def _wait_answering(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.options.start_timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if not self._process.alive():
                raise MpsError(f"control daemon exited at start ({self._read_startup_error()})")
            try:
                await self.client.ping()
                return
            except MpsError as exc:
                last = str(exc)
            await asyncio.sleep(0.05)
        raise MpsError(
            f"control daemon did not answer within {self.options.start_timeout_s:g} s: {last}"
        )

    def _read_startup_error(self) -> str:
        lines = self._logs[0].read_new_lines()
        return lines[-1] if lines else "no log line"

    async def apply_defaults(self) -> None:  # and read them back
        self._read_pct = await self.client.set_default_thread_pct(self.defaults.thread_pct)
        await self.client.set_default_memory_limit(
            DAEMON_DEVICE_ORDINAL, self.defaults.memory_limit_bytes
        )
        self._read_limit = self.defaults.memory_limit_bytes

    # -- health loop -----------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self._up_since is not None

    @property
    def process(self) -> proc.DaemonProcess | None:
        return self._process

    async def run(self) -> None:
        """Watch, and restart on exit or hang, until cancelled."""
        if not self.up:
            await self._restart(self.detail or "not running")
        while True:
            reason = self.memory.why_down(await self._watch())
            self._up_since = None
            self.detail = reason
            log.warning("MPS daemon of %s is down: %s", self.device.uuid, reason)
            self.emit("mps.daemon_down", reason)
            await self._restart(reason)

    async def _watch(self) -> str:
        assert self._process is not None
        exited = asyncio.create_task(
            self._process.wait_exit(), name=f"mps-exit-{self.device.index}"
        )
        misses = 0
        try:
            while True:
                await asyncio.wait([exited], timeout=self.options.probe_interval_s)
                self.follow_logs()
                if exited.done():
                    return f"daemon {self._process.pid} {proc.exit_text(exited.result())}"
                misses = 0 if await self.probe() else misses + 1
                self.answering = misses == 0  # closed to admission from the first miss
                if misses >= self.options.hung_after_probes:
                    return f"daemon {self._process.pid} hung: {misses} probes unanswered"
        finally:
            exited.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await exited

    async def probe(self) -> bool:
        """One health check: pipe permissions, liveness, defaults drift, servers, clients."""
        self.check_pipes()
        try:
            await self._check_defaults()
            self._servers = await self._list_servers()
        except MpsError as exc:
            self.detail = str(exc)
            return False
        if self._up_since and time.monotonic() - self._up_since > HEALTHY_RESET_S:
            self._failures = 0
        self.detail = ""
        return True

    async def _check_defaults(self) -> None:
        pct = await self.client.ping()
        limit = await self.client.default_memory_limit(DAEMON_DEVICE_ORDINAL)
        wanted_limit = self.defaults.memory_limit_bytes
        wanted_limit = None if wanted_limit is None else wanted_limit // 2**20 * 2**20
        if abs(pct - round(self.defaults.thread_pct, 1)) > 0.05 or limit != wanted_limit:
            self.drift_total += 1
            message = (
                f"daemon defaults changed behind the agent's back: thread {pct:.1f}% "
                f"(want {self.defaults.thread_pct:.1f}), memory limit {limit} "
                f"(want {wanted_limit}); re-applying"
            )
            log.warning("SECURITY %s on %s", message, self.device.uuid)
            self.emit("mps.defaults_drift", message, thread_pct=f"{pct:.1f}", limit=str(limit))
            await self.apply_defaults()
            return
        self._read_pct, self._read_limit = pct, limit

    async def refresh_servers(self) -> None:
        """Re-read the servers and their clients now (between probes)."""
        self._servers = await self._list_servers()

    async def _list_servers(self) -> tuple[MpsServerState, ...]:
        servers = []
        for pid in await self.client.server_pids():
            try:
                clients = await self.client.client_pids(pid)
            except MpsControlError:
                clients = []  # the server exited between the two commands
            servers.append(MpsServerState(pid, tuple(clients)))
        return tuple(servers)

    async def _restart(self, reason: str) -> None:
        if self._process is not None and self._process.alive():
            await self._process.kill()
        while True:
            delay = min(
                self.options.backoff_max_s, self.options.backoff_initial_s * 2**self._failures
            )
            self._failures += 1
            await asyncio.sleep(delay)
            try:
                await self.start()
            except MpsError as exc:
                self.detail = f"restart failed: {exc}"
                log.error(
                    "MPS daemon of %s did not restart: %s (next try in %.1f s)",
                    self.device.uuid,
                    exc,
                    min(self.options.backoff_max_s, delay * 2),
                )
                continue
            self.restarts += 1
            self.emit(
                "mps.daemon_restarted", f"restarted after: {reason}", restarts=str(self.restarts)
            )
            return

    # -- stop ------------------------------------------------------------------------------

    async def stop(self) -> None:
        """quit -t, wait, SIGTERM, SIGKILL; compute mode back to default; directories gone.
        A daemon of the MPS host is the host's to stop: it is left running."""
        if self.options.by_host:
            self.leave_running()
            return
        process, self._process = self._process, None
        self._up_since = None
        if process is not None and process.alive():
            quit_sent = True
            try:
                await self.client.quit(self.options.quit_timeout_s)
            except MpsError as exc:
                log.warning("quit of MPS daemon %d failed: %s", process.pid, exc)
                quit_sent = False
            how = await proc.stop_ladder(
                process,
                quit_sent=quit_sent,
                quit_wait_s=self.options.quit_timeout_s + 1.0,
                term_wait_s=2.0,
                device=self.device.uuid,
            )
            self.follow_logs()
            self.emit("mps.daemon_stopped", f"control daemon {process.pid} stopped by {how}")
        await self._set_exclusive(self.device, False)
        proc.remove_dirs(self.paths)
        self.memory.release()
        self.detail = "stopped"

    def leave_running(self) -> None:
        """Stop supervising and leave the daemon, its servers, clients, directories and
        compute mode as they are, for the next agent to adopt."""
        process, self._process = self._process, None
        self._up_since = None
        if process is not None and process.alive():
            process.leave_running()
            self.follow_logs()
            self.emit(
                "mps.daemon_kept",
                f"control daemon {process.pid} left running for the next agent",
                pid=str(process.pid),
            )
        self.detail = "left running"

    # -- view ------------------------------------------------------------------------------

    def state(self) -> MpsDaemonState:
        return MpsDaemonState(
            device_uuid=self.device.uuid,
            up=self.up,
            backend=self.options.binary,
            pid=self._process.pid if self._process is not None else None,
            restarts=self.restarts,
            default_thread_pct=self._read_pct,
            default_memory_limit_bytes=self._read_limit,
            detail=self.detail,
            pipe_dir=self.paths.pipe_dir,
            servers=self._servers,
            defaults_drift_total=self.drift_total,
            pipe_permission_violations_total=self.pipes.violations_total if self.pipes else 0,
            answering=self.answering,
        )
