"""``gpushare status`` states what each device isolates between its leases."""

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.api import convert
from agent.api.proto import agent_pb2 as pb
from agent.cli import main
from agent.core.snapshot import NodeSnapshot
from agent.core.types import Device, SharingMode
from agent.core.units import GIB

EXCLUSIVE = Device("GPU-aaaa", 0, "H100", 80 * GIB, SharingMode.EXCLUSIVE)
SHARED = Device("GPU-bbbb", 1, "H100", 80 * GIB, SharingMode.MPS)
MIG = Device(
    "MIG-cccc", 2, "H100", 40 * GIB, SharingMode.MPS, parent_uuid="GPU-c", mig_profile="3g.40gb"
)


def node(*devices: Device) -> pb.GetNodeResponse:
    return convert.snapshot_to_pb(
        NodeSnapshot(node_name="n1", simulated=True, taken_at=0.0, devices=devices)
    )


def status(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answer: pb.GetNodeResponse, *flags: str
) -> str:
    monkeypatch.setattr(main, "get_node", lambda *_a, **_k: answer)
    result = CliRunner().invoke(main.cli, ["--socket", str(tmp_path / "s.sock"), "status", *flags])
    assert result.exit_code == 0, result.output
    return result.output


def test_status_states_the_isolation_of_each_sharing_mode(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    output = status(monkeypatch, tmp_path, node(EXCLUSIVE, SHARED, MIG))
    block = output.split("isolated between the leases of a device:\n")[1].splitlines()
    assert block == [
        "  exclusive  memory: its own; faults: contained; compute: dedicated SMs",
        "  mps        memory: a per-client limit; faults: shared by its leases; "
        "compute: an SM share",
    ]
    assert all(len(line) <= 100 for line in block)


def test_status_json_carries_the_words_with_each_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    devices: list[dict[str, Any]] = json.loads(
        status(monkeypatch, tmp_path, node(EXCLUSIVE, MIG), "--json")
    )["devices"]
    assert [d["isolation"] for d in devices] == [
        {"memory": "hardware", "faults": "contained", "compute": "partition"},
        {"memory": "limit", "faults": "shared-with-trust-domain", "compute": "share"},
    ]


def test_an_agent_that_does_not_state_it_is_shown_per_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    answer = node(SHARED, MIG)
    answer.devices[1].ClearField("isolation")  # as an older agent answers
    output = status(monkeypatch, tmp_path, answer)
    assert "  GPU-bbbb  memory: a per-client limit;" in output
    assert "  MIG-cccc  not stated by this agent" in output
