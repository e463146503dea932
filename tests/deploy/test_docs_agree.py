"""The docs and the shipped files agree: one gRPC port and one metrics port everywhere, and
no install line names a package that is not this project."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).parents[2]
DOCS = [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("*/README.md")]
SHIPPED = [*REPO.glob("daemonset/*.yaml"), REPO / "systemd" / "config.yaml"]
DCGM_EXPORTER_PORT = 9400  # dcgm-exporter's own, not ours


def shipped_ports() -> set[int]:
    settings = yaml.safe_load((REPO / "systemd" / "config.yaml").read_text())
    return {int(settings["api"][key].rsplit(":", 1)[1]) for key in ("tcp_listen", "http_listen")}


def test_every_port_written_anywhere_is_one_the_agent_ships() -> None:
    allowed = shipped_ports() | {DCGM_EXPORTER_PORT}
    assert len(shipped_ports()) == 2
    for path in [*DOCS, *SHIPPED]:
        text = path.read_text()
        written = {int(p) for p in re.findall(r":(\d{4,5})\b", text)}
        written |= {int(p) for p in re.findall(r"(?:containerPort|port): (\d{4,5})\b", text)}
        assert written <= allowed, f"{path.relative_to(REPO)} names ports {written - allowed}"


def test_no_install_line_names_a_package_that_is_not_ours() -> None:
    for path in DOCS:
        for line in path.read_text().splitlines():
            assert not re.search(r"pip3? install\s+(-\S+\s+)*gpushare(\s|$|==|\[)", line), (
                f"{path.relative_to(REPO)}: {line.strip()}: the public index's gpushare is "
                "another project; install from a checkout or a built wheel"
            )


def test_the_checks_catch_what_they_look_for() -> None:
    assert re.search(r"pip3? install\s+(-\S+\s+)*gpushare(\s|$|==|\[)", "pip install -U gpushare")
    assert not re.search(r"pip3? install\s+(-\S+\s+)*gpushare(\s|$|==|\[)", "pip install .")
    assert {int(p) for p in re.findall(r":(\d{4,5})\b", "at host:7443")} == {7443}
