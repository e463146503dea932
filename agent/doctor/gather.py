"""The facts ``gpushare doctor`` checks that this node's files and NVML hold (the
Kubernetes API and the agent are asked by the CLI): thin, and nothing decided here."""

from __future__ import annotations

import asyncio
import grp
import os
import shutil
import stat
import sys
from pathlib import Path

from agent.config import Settings
from agent.core.errors import GpushareError
from agent.doctor.certificates import CertificateError, pem_validity
from agent.doctor.facts import (
    BinaryFacts,
    CertFacts,
    DeviceDirs,
    DeviceShm,
    DriverFacts,
    MpsDirFacts,
    PathFacts,
    ShmFacts,
)
from agent.mps import shmstate as shm
from agent.mps.control import FAKE_CONTROL_BINARY, REAL_CONTROL_BINARY
from agent.mps.daemon import lock_holder
from agent.mps.shm import mount_of, read_mountinfo
from agent.mps.version import MAX_BINARY_BYTES, embedded_release

CERT_SETTINGS = ("api.tls_cert_file", "api.tls_client_ca_file", "dra.api_ca")
KEY_SETTINGS = ("api.tls_key_file",)
CERTIFICATES = (*CERT_SETTINGS, *KEY_SETTINGS)


def path_facts(path: str, *, follow: bool = False) -> PathFacts:
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return PathFacts(path, exists=False)
    except OSError as exc:
        return PathFacts(path, exists=False, error=exc.strerror or str(exc))
    return PathFacts(
        path,
        exists=True,
        is_dir=stat.S_ISDIR(info.st_mode),
        mode=stat.S_IMODE(info.st_mode),
        uid=info.st_uid,
        gid=info.st_gid,
        writable=os.access(path, os.W_OK | os.X_OK),
    )


def binary_facts(settings: Settings, simulated: bool) -> BinaryFacts:
    """The control binary as the agent resolves ``mps.control_binary``."""
    configured = settings.mps.control_binary
    if configured != "auto":
        path = shutil.which(configured)
    else:
        path = shutil.which(REAL_CONTROL_BINARY)
        if path is None and simulated:
            beside = Path(sys.executable).parent / FAKE_CONTROL_BINARY
            path = str(beside) if beside.exists() else shutil.which(FAKE_CONTROL_BINARY)
    if path is None:
        return BinaryFacts(configured, "")
    fake = Path(path).name == FAKE_CONTROL_BINARY
    release = None
    if not fake:
        try:
            with open(path, "rb") as f:
                release = embedded_release(f.read(MAX_BINARY_BYTES))
        except OSError:
            release = None
    return BinaryFacts(
        configured, path, executable=os.access(path, os.X_OK), release=release, fake=fake
    )


def driver_facts(simulated: bool) -> DriverFacts:
    if simulated:
        return DriverFacts(simulated=True)

    async def ask() -> str | None:
        from agent.gpu.nvml import NvmlGpuBackend

        backend = NvmlGpuBackend()
        await backend.start()
        try:
            return await backend.driver_version()
        finally:
            await backend.aclose()

    try:
        return DriverFacts(simulated=False, version=asyncio.run(ask()))
    except (GpushareError, OSError, ImportError) as exc:
        return DriverFacts(simulated=False, error=str(exc) or type(exc).__name__)


def _agent_uid(settings: Settings) -> int:
    """The agent's user: the owner of its socket, else of its runtime directory."""
    for path in (settings.unix_socket_path, settings.paths.runtime_dir):
        try:
            return os.lstat(path).st_uid
        except OSError:
            continue
    return os.geteuid()


def _client_gid(settings: Settings) -> tuple[int | None, bool]:
    """(gid of the client group or None, whether mps.client_group names no group)."""
    m = settings.mps
    if m.client_gid >= 0:
        return m.client_gid, False
    if not m.client_group:
        return None, False
    try:
        return grp.getgrnam(m.client_group).gr_gid, False
    except KeyError:
        return None, True


def mps_dir_facts(settings: Settings, *, agent_running: bool) -> MpsDirFacts:
    root = settings.mps_root_dir
    gid, missing = _client_gid(settings)
    devices = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        names = []
    for name in names:
        base = f"{root}/{name}"
        if not os.path.isdir(base) or os.path.islink(base):
            continue
        devices.append(
            DeviceDirs(
                name, path_facts(base), path_facts(f"{base}/pipe"), path_facts(f"{base}/log")
            )
        )
    return MpsDirFacts(
        root=path_facts(root),
        devices=devices,
        agent_uid=_agent_uid(settings),
        client_gid=gid,
        group="" if settings.mps.client_gid >= 0 else settings.mps.client_group,
        group_missing=missing,
        agent_running=agent_running,
    )


def shm_facts(settings: Settings) -> ShmFacts:
    k, d = settings.kubelet, settings.dra
    directory = (k.shm_dir if k.enabled else "") or (d.shm_dir if d.enabled else "")
    options = shm.ShmOptions.of(settings.mps)
    return ShmFacts(
        kubelet_enabled=k.enabled,
        kubelet_shm_dir=k.shm_dir,
        dra_enabled=d.enabled,
        dra_shm_dir=d.shm_dir,
        directory=path_facts(directory, follow=True) if directory else None,
        client_gid=_client_gid(settings)[0],
        shm_root=options.root,
        root=path_facts(options.root) if options.enabled else None,
        devices=device_shm_facts(settings.mps_root_dir, options) if options.enabled else (),
        in_pod=in_pod(),
    )


def in_pod() -> bool:
    """Whether this process runs in a Kubernetes pod (the kubelet sets this variable in
    every container): then a host path is seen only where the pod mounts it."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def device_shm_facts(mps_root: str, options: shm.ShmOptions) -> list[DeviceShm]:
    """Per device with an MPS directory: what its live daemon's servers see (its record,
    checked through /proc where this user may look) and what is mounted for it."""
    try:
        names = sorted(os.listdir(mps_root))
        mountinfo = read_mountinfo()
    except OSError:
        return []
    found = []
    for uuid in names:
        if not os.path.isdir(f"{mps_root}/{uuid}/pipe"):
            continue
        directory = options.device_dir(uuid)
        pid = lock_holder(f"{mps_root}/{uuid}/pipe")
        if pid:
            state = shm.judge(
                options,
                uuid,
                pid=pid,
                start=shm.start_time(pid),
                record=shm.read_record(shm.record_path(f"{mps_root}/{uuid}")),
                seen=shm.sees(pid, directory),
            )
            kind: str = state.kind
            reason = state.reason
        else:
            kind, reason = "none", "no control daemon runs"
        entry = mount_of(directory, mountinfo)
        found.append(
            DeviceShm(
                uuid,
                directory,
                kind,
                reason,
                fstype=entry.fstype if entry else "",
                size_bytes=entry.size_bytes if entry else None,
                lacks=tuple(entry.lacks()) if entry else (),
            )
        )
    return found


def _setting(settings: Settings, key: str) -> str:
    group, _, name = key.partition(".")
    return str(getattr(getattr(settings, group), name))


def cert_facts(settings: Settings) -> list[CertFacts]:
    found = []
    for key in CERTIFICATES:
        path = _setting(settings, key)
        if not path:
            continue
        is_key = key in KEY_SETTINGS
        try:
            text = Path(path).read_text()
            validity = [] if is_key else pem_validity(text)
        except OSError as exc:
            found.append(CertFacts(key, path, error=f"cannot read it: {exc.strerror}"))
            continue
        except (CertificateError, UnicodeDecodeError) as exc:
            found.append(CertFacts(key, path, error=f"not a PEM certificate: {exc}"))
            continue
        found.append(CertFacts(key, path, validity=tuple(validity), is_key=is_key))
    return found
