"""`gpushare doctor`'s shared-memory check in the agent's pod of each path (the node of
conftest.py): red, naming the fix, on each broken install of issue 39 (the shm directory
the doctor checks not mounted in the agent's pod, closed to the clients, or the per-device
tmpfs not seen there); a warning for a daemon an earlier release left running."""

from __future__ import annotations

import json
import os

import pytest

from tests.e2e.doctor_chart.chart import Node, earlier_daemon, moved_away, shm_key


def test_a_daemon_of_an_earlier_release_is_a_warning(node: Node) -> None:
    device = node.devices()[0]
    with earlier_daemon(device) as pid:
        code, lines = node.doctor()
    assert code == 0, lines
    status, rest = lines["mps-shm"]
    assert status == "warn"
    assert rest.startswith(f"{device.name}: daemon {pid} has no record of its shared memory")
    assert f"the containers of these devices share {node.shared_shm}" in rest


# -- red, naming the fix, on a broken one -------------------------------------------------------


def test_the_shared_shm_directory_not_mounted_in_the_pod(node: Node) -> None:
    device = node.devices()[0]
    with moved_away(node.shared_shm):
        code, lines = node.doctor()
        assert code == 0 and lines["mps-shm"][0] == "ok"  # no daemon uses it: not checked
        with earlier_daemon(device):
            code, lines = node.doctor()
        assert code == 1
        status, rest = lines["mps-shm"]
        assert status == "fail"
        assert f"{node.shared_shm} is not in this pod ({shm_key(node)})" in rest
        assert (
            f"fix: mount the host's {node.shared_shm} into the agent's pod at the same path "
            "(hostPath, read-only will do: the chart's shm.hostPath" in rest
        )
        # shm.size "": no tmpfs per device, every container gets the shared directory
        code, lines = node.doctor("--set", "mps.shm_root=")
        assert code == 1 and lines["mps-shm"][0] == "fail"
        assert (
            f"fix: mount the host's {node.shared_shm} into the agent's pod" in (lines["mps-shm"][1])
        )
    code, lines = node.doctor("--set", "mps.shm_root=")
    assert code == 0 and lines["mps-shm"][0] == "warn"
    assert "one /dev/shm for every tenant of the node" in lines["mps-shm"][1]


def test_the_shared_shm_directory_closed_to_the_clients(node: Node) -> None:
    os.chmod(node.shared_shm, 0o755)
    try:
        code, lines = node.doctor("--set", "mps.shm_root=")
    finally:
        os.chmod(node.shared_shm, 0o1777)
    assert code == 1
    assert lines["mps-shm"][0] == "fail"
    assert "MPS clients of other users cannot create their segments in it" in lines["mps-shm"][1]
    assert f"fix: chmod 1777 {node.shared_shm} (on the host)" in lines["mps-shm"][1]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_the_device_tmpfs_not_seen_in_the_pod(node: Node) -> None:
    """The mps-host pod gave the daemon its tmpfs, but the agent's pod does not see it
    there (its run volume without Bidirectional or HostToContainer propagation): what
    the doctor sees at <shm_root>/<uuid> is the empty directory under the mount."""
    device = node.devices()[0]
    directory = node.shm_root / device.name
    directory.mkdir()
    try:
        with earlier_daemon(device) as pid:
            record = {"pid": pid, "start": None, "dir": str(directory), "reason": ""}
            (device / "shm.json").write_text(json.dumps(record))
            code, lines = node.doctor()
    finally:
        directory.rmdir()
    assert code == 1
    status, rest = lines["mps-shm"]
    assert status == "fail"
    assert f"{device.name}: daemon {pid} should have {directory} at /dev/shm but has not" in rest
    assert (
        f"fix: mount the host directory that holds {node.shm_root} into the agent's pod with "
        "mountPropagation Bidirectional (or HostToContainer)" in rest
    )
