import os
import stat
from pathlib import Path

import pytest

from agent.config import load_settings
from agent.core.errors import ConfigError, GpushareError
from agent.runtime import checks


def settings(**values: object):  # type: ignore[no-untyped-def]
    return load_settings(overrides=values)


def test_real_binary_on_path_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "nvidia-cuda-mps-control"
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert checks.resolve_control_binary(settings(**{"sim.enabled": True})) == str(real)


def test_simulated_node_falls_back_to_the_fake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no real binary anywhere
    chosen = checks.resolve_control_binary(settings(**{"sim.enabled": True}))
    assert chosen.endswith("gpushare-fake-mps-control")
    with pytest.raises(GpushareError, match="nvidia-cuda-mps-control was not found"):
        checks.resolve_control_binary(settings())


def test_configured_binary_must_exist() -> None:
    with pytest.raises(ConfigError, match=r"mps\.control_binary"):
        checks.resolve_control_binary(settings(**{"mps.control_binary": "/nope/mps"}))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("api.http_listen", "localhost"),
        ("api.http_listen", "127.0.0.1:99999"),
        ("api.tcp_listen", "0.0.0.0:7000"),
        ("api.tcp_listen", "10.1.2.3:7000"),
        ("api.token_file", "/nonexistent/token"),
        ("api.unix_socket", "/tmp/" + "x" * 120),
        ("mps.default_memory_limit", "lots"),
        ("mps.default_memory_limit", "1KiB"),
    ],
)
def test_bad_settings_are_named(key: str, value: str) -> None:
    values = {key: value}
    if key == "api.token_file":
        values["api.tcp_listen"] = "127.0.0.1:7000"
    with pytest.raises(ConfigError) as info:
        checks.check_settings(settings(**values))
    assert info.value.key == key


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "[::1]:9000", "localhost:7000"])
def test_loopback_tcp_without_authentication_is_refused(listen: str) -> None:
    with pytest.raises(ConfigError) as info:
        checks.check_settings(settings(**{"api.tcp_listen": listen}))
    assert info.value.key == "api.tcp_listen"


def test_runtime_dir_that_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by it alone"):
        checks.prepare_runtime_dir(str(shared))
    mine = tmp_path / "mine" / "run"
    checks.prepare_runtime_dir(str(mine))
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o755
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError):
        checks.prepare_runtime_dir(str(tmp_path / "file"))


def test_a_new_runtime_dir_stays_traversable_under_the_agents_umask(tmp_path: Path) -> None:
    """Clients reach their MPS pipe directory through it; `gpushare serve` runs with 077."""
    previous = os.umask(0o077)
    try:
        checks.prepare_runtime_dir(str(tmp_path / "run"))
        checks.prepare_state_dir(str(tmp_path / "state"))
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
