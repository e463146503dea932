"""Start-up checks and small resolutions that the composition root needs; errors name the
setting (exit code 2) or say what is missing."""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import stat
import sys
from pathlib import Path

from agent.config import Settings
from agent.config.fields import setting_bytes
from agent.core.errors import ConfigError, GpushareError
from agent.mps.control import FAKE_CONTROL_BINARY, REAL_CONTROL_BINARY
from agent.sim.node import SimNodeSpec, parse_sim_node

log = logging.getLogger(__name__)

MAX_UNIX_SOCKET_PATH = 107


def split_listen(key: str, listen: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); a ConfigError names ``key``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535 or not host:
        raise ConfigError(key, f"must be host:port, e.g. 127.0.0.1:9808 (got {listen!r})")
    return host.strip("[]"), int(port)


def check_settings(settings: Settings) -> None:
    if settings.api.http_listen:
        split_listen("api.http_listen", settings.api.http_listen)
    check_tcp_listen(settings)
    if len(settings.unix_socket_path.encode()) > MAX_UNIX_SOCKET_PATH:
        raise ConfigError(
            "api.unix_socket",
            f"path is longer than {MAX_UNIX_SOCKET_PATH} "
            f"bytes, which Unix sockets cannot use: {settings.unix_socket_path}",
        )
    memory_limit_bytes(settings)


def check_tcp_listen(settings: Settings) -> None:
    """Every TCP listener authenticates, loopback included: mutual TLS, or a token over
    server TLS; a plaintext token only on loopback behind ``api.insecure_loopback``."""
    api = settings.api
    if not api.tcp_listen:
        return
    host, _port = split_listen("api.tcp_listen", api.tcp_listen)
    if bool(api.tls_cert_file) != bool(api.tls_key_file):
        raise ConfigError("api.tls_cert_file", "TLS needs both api.tls_cert_file and tls_key_file")
    if api.tls_client_ca_file and not api.tls_cert_file:
        raise ConfigError(
            "api.tls_client_ca_file", "mutual TLS also needs api.tls_cert_file and tls_key_file"
        )
    for key, path in (
        ("api.token_file", api.token_file),
        ("api.tls_cert_file", api.tls_cert_file),
        ("api.tls_key_file", api.tls_key_file),
        ("api.tls_client_ca_file", api.tls_client_ca_file),
    ):
        if path and not os.access(path, os.R_OK):
            raise ConfigError(key, f"cannot read {path}")
    if api.tls_client_ca_file or (api.tls_cert_file and api.token_file):
        return
    if api.tls_cert_file:
        raise ConfigError(
            "api.token_file",
            "server TLS without a client CA authenticates nobody: set api.token_file, or "
            "api.tls_client_ca_file for mutual TLS",
        )
    _check_plaintext(
        api.tcp_listen, host, token=bool(api.token_file), allowed=api.insecure_loopback
    )


def _check_plaintext(listen: str, host: str, *, token: bool, allowed: bool) -> None:
    if not token:
        raise ConfigError(
            "api.tcp_listen",
            f"a TCP listener ({listen}) must authenticate, loopback included: set "
            "api.tls_cert_file, tls_key_file and tls_client_ca_file (mutual TLS), or "
            "api.tls_cert_file, tls_key_file and api.token_file",
        )
    if not is_loopback(host):
        raise ConfigError(
            "api.tcp_listen",
            f"{listen} is not a loopback address: a bearer token needs server TLS "
            "(api.tls_cert_file and tls_key_file)",
        )
    if not allowed:
        raise ConfigError(
            "api.insecure_loopback",
            f"a bearer token over plaintext on {listen} needs api.insecure_loopback: true "
            "(development only), or server TLS (api.tls_cert_file and tls_key_file)",
        )


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def memory_limit_bytes(settings: Settings) -> int | None:
    text = settings.mps.default_memory_limit
    if not text:
        return None
    value = setting_bytes("mps.default_memory_limit", text)
    if value < 2**20:
        raise ConfigError("mps.default_memory_limit", "must be at least 1MiB")
    return value


def load_sim_spec(node_file: str) -> SimNodeSpec:
    if not node_file:
        return SimNodeSpec.default()
    try:
        text = Path(node_file).read_text()
    except OSError as exc:
        raise ConfigError("sim.node_file", f"cannot read {node_file}: {exc.strerror}") from exc
    return parse_sim_node(text, source=node_file)


def resolve_control_binary(settings: Settings, *, allow_fake: bool = False) -> str:
    """The MPS control front-end to use: configured, real on PATH, or the fake (on a
    simulated node, or when ``allow_fake``)."""
    configured = settings.mps.control_binary
    if configured != "auto":
        found = shutil.which(configured)
        if found is None:
            raise ConfigError("mps.control_binary", f"{configured} is not an executable")
        return found
    real = shutil.which(REAL_CONTROL_BINARY)
    if real is not None:
        return real
    if settings.sim.enabled or allow_fake:
        beside = Path(sys.executable).parent / FAKE_CONTROL_BINARY
        fake = str(beside) if beside.exists() else shutil.which(FAKE_CONTROL_BINARY)
        if fake is not None:
            return fake
    raise GpushareError(
        f"{REAL_CONTROL_BINARY} was not found on PATH: install the NVIDIA driver's MPS "
        "utilities, or set mps.control_binary"
    )


def _own_dir(key: str, path: str, mode: int) -> os.stat_result:
    """Create ``path`` with ``mode`` if missing (exactly ``mode``: the agent's umask 077
    would narrow it); its lstat, or a ConfigError naming ``key``."""
    try:
        if not os.path.lexists(path):
            Path(path).mkdir(mode=mode, parents=True, exist_ok=True)
            os.chmod(path, mode)
        info = os.lstat(path)
    except OSError as exc:
        raise ConfigError(key, f"cannot create {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise ConfigError(key, f"{path} must be a directory owned by uid {os.geteuid()}")
    return info


def prepare_runtime_dir(path: str) -> None:
    """Create the runtime directory (0755) and refuse one that others could tamper with."""
    info = _own_dir("paths.runtime_dir", path, 0o755)
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            "paths.runtime_dir",
            f"{path} must be owned by uid {os.geteuid()} and writable by it alone",
        )


def prepare_state_dir(path: str) -> None:
    """Create the state directory 0700; tighten an existing one of ours (and its store
    files) that group or others could reach; refuse one owned by someone else."""
    _own_dir("paths.state_dir", path, 0o700)
    directory = Path(path)
    for item in (directory, *directory.glob("gpushare.db*")):
        mode = stat.S_IMODE(item.lstat().st_mode)
        wanted = 0o700 if item == directory else 0o600
        if mode & 0o077 and not item.is_symlink():
            log.warning("tightening %s from %04o to %04o", item, mode, wanted)
            item.chmod(wanted)
