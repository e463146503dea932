"""`gpushare doctor`: each check over facts that break one prerequisite at a time, and the
command's usage. The certificates' checks and dates are in test_doctor_certificates.py;
the facts gathered from real files and from the stand-in API server, in
test_doctor_gather.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import doctor as pf
from agent.cli.main import cli
from agent.doctor import (
    AgentFacts,
    BinaryFacts,
    DeviceDirs,
    DriverFacts,
    Finding,
    KubeFacts,
    MpsDirFacts,
    PathFacts,
    ShmFacts,
)

REAL = "/usr/bin/nvidia-cuda-mps-control"
FAKE = "/venv/bin/gpushare-fake-mps-control"


def line(f: Finding) -> str:
    return pf.render([f])[0]


# -- rendering -------------------------------------------------------------------------------


def test_render_pads_the_check_column_and_adds_the_fix() -> None:
    lines = pf.render(
        [Finding("ok", "agent", "answers"), Finding("fail", "cdi-dir", "missing", "mkdir it")]
    )
    assert lines == ["ok    agent    answers", "fail  cdi-dir  missing  fix: mkdir it"]
    assert pf.failed([Finding("warn", "a", "b")]) is False
    assert pf.failed([Finding("warn", "a", "b"), Finding("fail", "c", "d")]) is True


# -- MPS binary and the driver ----------------------------------------------------------------

GOOD_BINARY = BinaryFacts("auto", REAL, executable=True, release="535.309.01")


@pytest.mark.parametrize(
    ("simulated", "binary", "status", "found", "fix"),
    [
        (False, GOOD_BINARY, "ok", f"{REAL} (driver release 535.309.01)", ""),
        (False, BinaryFacts("auto", ""), "fail", "not on PATH", "install the driver's MPS"),
        (False, BinaryFacts("/opt/x", ""), "fail", "/opt/x is not an executable", "point mps"),
        (False, BinaryFacts("auto", REAL), "fail", "not executable", f"chmod 0755 {REAL}"),
        (True, BinaryFacts("auto", FAKE, True, fake=True), "ok", "the bundled fake", ""),
        (False, BinaryFacts("auto", FAKE, True, fake=True), "fail", "on a real node", "auto"),
        (False, dataclasses.replace(GOOD_BINARY, release=None), "ok", "no release embedded", ""),
    ],
)
def test_mps_binary(
    simulated: bool, binary: BinaryFacts, status: str, found: str, fix: str
) -> None:
    f = pf.check_mps_binary(simulated, binary)
    assert (f.status, f.check) == (status, "mps-binary")
    assert found in f.found and fix in f.fix


@pytest.mark.parametrize(
    ("driver", "binary", "status", "found", "fix"),
    [
        (DriverFacts(True), GOOD_BINARY, "skip", "simulated node", ""),
        (DriverFacts(False, "535.309.01"), GOOD_BINARY, "ok", "driver 535.309.01 = ", ""),
        (
            DriverFacts(False, "550.54.15"),
            GOOD_BINARY,
            "fail",
            "is from driver release 535.309.01 but the running driver is 550.54.15",
            "use the driver's own MPS binaries",
        ),
        (
            DriverFacts(False, error="NVML Shared Library Not Found"),
            GOOD_BINARY,
            "fail",
            "NVML cannot be asked: NVML Shared Library Not Found",
            "nvidia RuntimeClass",
        ),
        (
            DriverFacts(False, "535.309.01"),
            dataclasses.replace(GOOD_BINARY, release=None),
            "warn",
            "names no release",
            "the driver's own",
        ),
        (DriverFacts(False, "535.309.01"), BinaryFacts("auto", ""), "warn", "no MPS control", ""),
    ],
)
def test_driver_release(
    driver: DriverFacts, binary: BinaryFacts, status: str, found: str, fix: str
) -> None:
    f = pf.check_driver(driver, binary)
    assert (f.status, f.check) == (status, "driver-release")
    assert found in f.found and fix in f.fix


# -- Kubernetes ----------------------------------------------------------------------------


def node(labels: dict[str, str], allocatable: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "metadata": {"name": "n1", "labels": labels},
        "status": {"allocatable": allocatable or {}},
    }


API = KubeFacts(
    api="https://k:6443",
    node_name="n1",
    node=node({pf.GPU_PRESENT_LABEL: "true"}),
    runtime_class_found=True,
)


@pytest.mark.parametrize(
    ("kube", "label", "runtime_class", "plugin"),
    [
        (API, "ok", "ok", "ok"),
        (KubeFacts(why="not in a cluster"), "skip", "skip", "skip"),
        (dataclasses.replace(API, node=node({})), "fail", "ok", "ok"),
        (dataclasses.replace(API, node=node({pf.GPU_PRESENT_LABEL: "false"})), "fail", "ok", "ok"),
        (dataclasses.replace(API, node=None, node_error="404 NotFound"), "fail", "ok", "fail"),
        (dataclasses.replace(API, runtime_class_found=False), "ok", "fail", "ok"),
        (
            dataclasses.replace(API, runtime_class_found=None, runtime_class_error="403"),
            "ok",
            "fail",
            "ok",
        ),
        (
            dataclasses.replace(
                API, node=node({pf.GPU_PRESENT_LABEL: "true"}, {"nvidia.com/gpu": "8"})
            ),
            "ok",
            "ok",
            "warn",
        ),
    ],
)
def test_kubernetes_checks(kube: KubeFacts, label: str, runtime_class: str, plugin: str) -> None:
    got = (
        pf.check_node_label(kube),
        pf.check_runtime_class(kube),
        pf.check_device_plugin(kube),
    )
    assert [f.status for f in got] == [label, runtime_class, plugin]
    for f in got:
        assert (f.status == "fail") == bool(f.fix) or f.status == "warn"
    if kube.api == "":
        assert all(f.found == "skipped: no API (not in a cluster)" for f in got)


def test_the_label_fix_names_the_node_and_the_label() -> None:
    f = pf.check_node_label(dataclasses.replace(API, node=node({})))
    assert "node n1 has neither gpushare.io/node=true" in f.found
    assert "kubectl label node n1 gpushare.io/node=true" in f.fix


@pytest.mark.parametrize(
    ("labels", "status"),
    [
        ({"gpushare.io/node": "true"}, "ok"),  # the chart's opt-in label
        ({"nvidia.com/gpu.present": "true"}, "ok"),  # the plain manifests'
        ({"gpushare.io/node": "false"}, "fail"),
        ({}, "fail"),
    ],
)
def test_either_selector_label_is_a_labelled_node(labels: dict[str, str], status: str) -> None:
    assert pf.check_node_label(dataclasses.replace(API, node=node(labels))).status == status


# -- MPS directories ----------------------------------------------------------------------


def d(path: str, mode: int, uid: int = 0, gid: int = 0, **kw: object) -> PathFacts:
    return PathFacts(path, exists=True, is_dir=True, mode=mode, uid=uid, gid=gid, **kw)  # type: ignore[arg-type]


def device(
    uuid: str = "GPU-1", pipe: int = 0o750, log: int = 0o750, base: int = 0o755, gid: int = 50
) -> DeviceDirs:
    return DeviceDirs(
        uuid,
        d(f"/r/mps/{uuid}", base),
        d(f"/r/mps/{uuid}/pipe", pipe, gid=gid),
        d(f"/r/mps/{uuid}/log", log, gid=gid),
    )


DIRS = MpsDirFacts(
    root=d("/r/mps", 0o755), devices=[device()], agent_uid=0, client_gid=50, group="gpushare"
)


@pytest.mark.parametrize(
    ("facts", "status", "found", "fix"),
    [
        (DIRS, "ok", "1 device(s) under /r/mps: pipe and log 0750 uid 0 gid 50", ""),
        (
            dataclasses.replace(DIRS, devices=[device(pipe=0o777)]),
            "fail",
            "/r/mps/GPU-1/pipe is 0777 uid 0 gid 50, must be 0750 uid 0 gid 50",
            "chown 0:50 /r/mps/GPU-1/pipe && chmod 0750 /r/mps/GPU-1/pipe",
        ),
        (
            dataclasses.replace(DIRS, devices=[device(gid=0)]),
            "fail",
            "/r/mps/GPU-1/pipe is 0750 uid 0 gid 0, must be 0750 uid 0 gid 50",
            "chown 0:50",
        ),
        (
            dataclasses.replace(DIRS, agent_uid=1000),
            "fail",
            "must be 0750 uid 1000 gid 50",
            "chown 1000:50",
        ),
        (
            dataclasses.replace(DIRS, devices=[device(base=0o777)]),
            "fail",
            "/r/mps/GPU-1 is writable by group or others (0777)",
            "chmod 0755 /r/mps/GPU-1",
        ),
        (
            dataclasses.replace(
                DIRS,
                devices=[
                    DeviceDirs(
                        "GPU-1",
                        d("/r/mps/GPU-1", 0o755),
                        PathFacts("/r/mps/GPU-1/pipe", False),
                        d("/r/mps/GPU-1/log", 0o750, gid=50),
                    )
                ],
            ),
            "fail",
            "/r/mps/GPU-1/pipe is missing",
            "restart the agent",
        ),
        (
            dataclasses.replace(DIRS, root=PathFacts("/r/mps", False), agent_running=True),
            "fail",
            "does not exist while the agent runs",
            "restart the agent",
        ),
        (
            dataclasses.replace(DIRS, root=PathFacts("/r/mps", False)),
            "warn",
            "does not exist yet",
            "",
        ),
        (dataclasses.replace(DIRS, devices=[]), "warn", "no device directories", ""),
        (
            dataclasses.replace(
                DIRS,
                devices=[device(pipe=0o700, log=0o700, gid=0)],
                client_gid=None,
                group_missing=True,
            ),
            "warn",
            "mps.client_group 'gpushare' does not exist",
            "create the group gpushare",
        ),
        (
            dataclasses.replace(DIRS, devices=[device(pipe=0o750, gid=0)], client_gid=None),
            "fail",
            "must be 0700 uid 0 gid -",
            "chown 0 /r/mps/GPU-1/pipe && chmod 0700",
        ),
    ],
)
def test_mps_dirs(facts: MpsDirFacts, status: str, found: str, fix: str) -> None:
    f = pf.check_mps_dirs(facts)
    assert (f.status, f.check) == (status, "mps-pipes")
    assert found in f.found and fix in f.fix


def test_many_bad_pipe_directories_are_listed_shortly() -> None:
    facts = dataclasses.replace(DIRS, devices=[device(f"GPU-{i}", pipe=0o777) for i in range(5)])
    assert "(+2 more)" in pf.check_mps_dirs(facts).found


# -- shm ----------------------------------------------------------------------------------

SHM = ShmFacts(True, "/dev/shm-mps", False, "", d("/dev/shm-mps", 0o1777), client_gid=50)


@pytest.mark.parametrize(
    ("facts", "status", "found", "fix"),
    [
        (SHM, "warn", "/dev/shm-mps exists, mode 1777", ""),
        (ShmFacts(False, "", False, ""), "skip", "no Kubernetes path", ""),
        (
            ShmFacts(True, "", True, ""),
            "warn",
            "kubelet.shm_dir and dra.shm_dir empty",
            "mounts at /dev/shm",
        ),
        (ShmFacts(True, "/a", True, "/b"), "fail", "/a and dra.shm_dir /b differ", "set both"),
        (
            dataclasses.replace(SHM, directory=PathFacts("/dev/shm-mps", False)),
            "fail",
            "/dev/shm-mps does not exist",
            "mkdir -p /dev/shm-mps && chmod 1777",
        ),
        (
            dataclasses.replace(
                SHM, directory=PathFacts("/dev/shm-mps", True, is_dir=False, mode=0o644)
            ),
            "fail",
            "is not a directory",
            "mkdir",
        ),
        (
            dataclasses.replace(SHM, directory=d("/dev/shm-mps", 0o755)),
            "fail",
            "cannot create their segments",
            "chmod 1777 /dev/shm-mps",
        ),
        (
            dataclasses.replace(SHM, directory=d("/dev/shm-mps", 0o777)),
            "warn",
            "without the sticky bit",
            "chmod 1777",
        ),
        (dataclasses.replace(SHM, directory=d("/dev/shm-mps", 0o3770, gid=50)), "warn", "3770", ""),
    ],
)
def test_shm(facts: ShmFacts, status: str, found: str, fix: str) -> None:
    f = pf.check_shm(facts)
    assert (f.status, f.check) == (status, "mps-shm")
    assert found in f.found and fix in f.fix


# -- plugin and CDI directories --------------------------------------------------------------


@pytest.mark.parametrize(
    ("enabled", "facts", "status", "found", "fix"),
    [
        (True, d("/var/run/cdi", 0o755, writable=True), "ok", "exists and is writable", ""),
        (False, PathFacts("/var/run/cdi", False), "skip", "dra.enabled is off", ""),
        (
            True,
            PathFacts("/var/run/cdi", False),
            "fail",
            "/var/run/cdi (dra.cdi_dir) does not exist",
            "mount the host's /var/run/cdi",
        ),
        (True, d("/var/run/cdi", 0o755), "fail", "not writable by this user", "run the agent as"),
        (True, PathFacts("/var/run/cdi", True, mode=0o644), "fail", "not a directory", ""),
        (True, PathFacts("/var/run/cdi", False, error="Permission denied"), "fail", "denied", ""),
    ],
)
def test_dirs(enabled: bool, facts: PathFacts, status: str, found: str, fix: str) -> None:
    f = pf.check_dir("cdi-dir", "dra.cdi_dir", "dra.enabled", enabled, facts)
    assert (f.status, f.check) == (status, "cdi-dir")
    assert found in f.found and fix in f.fix


# -- the agent ---------------------------------------------------------------------------------


def test_agent() -> None:
    ok = pf.check_agent(AgentFacts("/run/gpushare/agent.sock", node_name="w1", devices=4))
    assert line(ok) == (
        "ok    agent  answers on /run/gpushare/agent.sock: node w1 (real node), 4 device(s), agent "
    )
    down = pf.check_agent(AgentFacts("/s", error="no agent socket at /s"))
    assert down.status == "fail" and "systemctl start gpushare-agent" in down.fix


# -- usage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["doctor", "--api-ca", "/x"],
        ["doctor", "--timeout", "0"],
        ["doctor", "--set", "novalue"],
        ["doctor", "--set", "mps.client_gid=x"],
        ["doctor", "--bogus"],
    ],
)
def test_usage_errors_exit_2(args: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--socket", str(tmp_path / "agent.sock"), *args])
    assert result.exit_code == 2, result.output


def test_help() -> None:
    result = CliRunner().invoke(cli, ["doctor", "--help"])
    assert result.exit_code == 0 and "--api-server" in result.output
