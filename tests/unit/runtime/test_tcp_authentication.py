"""Which TCP listener configurations start: every one authenticates, loopback included."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import load_settings
from agent.core.errors import ConfigError
from agent.runtime import checks


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    names = ("token", "cert", "key", "ca")
    for name in names:
        (tmp_path / name).write_text("x")
    return {name: str(tmp_path / name) for name in names}


def settings_with(files: dict[str, str], listen: str, parts: str, *, insecure: bool) -> object:
    values: dict[str, object] = {"api.tcp_listen": listen, "api.insecure_loopback": insecure}
    keys = {
        "token": "api.token_file",
        "cert": "api.tls_cert_file",
        "key": "api.tls_key_file",
        "ca": "api.tls_client_ca_file",
    }
    for part in parts.split("+") if parts else ():
        values[keys[part]] = files[part]
    return load_settings(overrides=values)


@pytest.mark.parametrize(
    ("listen", "parts", "insecure", "refused_key"),
    [
        # mutual TLS, with or without a token, anywhere
        ("0.0.0.0:9807", "cert+key+ca", False, None),
        ("127.0.0.1:9807", "cert+key+ca+token", False, None),
        # a token over server TLS, anywhere
        ("0.0.0.0:9807", "cert+key+token", False, None),
        ("[::1]:9807", "cert+key+token", False, None),
        # nothing at all: refused, loopback too, even with insecure_loopback
        ("0.0.0.0:9807", "", False, "api.tcp_listen"),
        ("127.0.0.1:9807", "", False, "api.tcp_listen"),
        ("localhost:9807", "", True, "api.tcp_listen"),
        # server TLS that authenticates nobody
        ("127.0.0.1:9807", "cert+key", False, "api.token_file"),
        # a plaintext token: loopback behind insecure_loopback only
        ("127.0.0.1:9807", "token", False, "api.insecure_loopback"),
        ("127.0.0.1:9807", "token", True, None),
        ("[::1]:9807", "token", True, None),
        ("0.0.0.0:9807", "token", True, "api.tcp_listen"),
        ("10.1.2.3:9807", "token", False, "api.tcp_listen"),
        # half a TLS configuration
        ("127.0.0.1:9807", "cert+token", False, "api.tls_cert_file"),
        ("127.0.0.1:9807", "key+token", False, "api.tls_cert_file"),
        ("127.0.0.1:9807", "ca+token", True, "api.tls_client_ca_file"),
    ],
)
def test_tcp_listener_authentication_matrix(
    files: dict[str, str], listen: str, parts: str, insecure: bool, refused_key: str | None
) -> None:
    settings = settings_with(files, listen, parts, insecure=insecure)
    if refused_key is None:
        checks.check_tcp_listen(settings)  # type: ignore[arg-type]
        return
    with pytest.raises(ConfigError) as info:
        checks.check_tcp_listen(settings)  # type: ignore[arg-type]
    assert info.value.key == refused_key


def test_unreadable_tls_file_is_named(files: dict[str, str]) -> None:
    values = {
        "api.tcp_listen": "127.0.0.1:1",
        "api.tls_cert_file": files["cert"],
        "api.tls_key_file": "/nonexistent/key",
        "api.tls_client_ca_file": files["ca"],
    }
    with pytest.raises(ConfigError) as info:
        checks.check_tcp_listen(load_settings(overrides=values))
    assert info.value.key == "api.tls_key_file"


def test_state_dir_is_created_0700_and_an_open_one_is_tightened(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh" / "state"
    checks.prepare_state_dir(str(fresh))
    assert fresh.stat().st_mode & 0o777 == 0o700
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    old.chmod(0o755)
    (old / "gpushare.db").write_text("")
    (old / "gpushare.db").chmod(0o644)
    (old / "other.txt").write_text("")
    (old / "other.txt").chmod(0o644)
    checks.prepare_state_dir(str(old))
    assert old.stat().st_mode & 0o777 == 0o700
    assert (old / "gpushare.db").stat().st_mode & 0o777 == 0o600
    assert (old / "other.txt").stat().st_mode & 0o777 == 0o644  # not the agent's file
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError) as info:
        checks.prepare_state_dir(str(tmp_path / "file"))
    assert info.value.key == "paths.state_dir"
