import re

import pytest

from agent.core.errors import SimulationError
from agent.core.types import SharingMode
from agent.core.units import GIB
from agent.sim.node import SimNodeSpec, parse_sim_node

UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_default_node_is_four_h100() -> None:
    devices = SimNodeSpec.default().devices
    assert [d.index for d in devices] == [0, 1, 2, 3]
    assert {d.model for d in devices} == {"H100-SXM5-80GB"}
    assert {d.memory_bytes for d in devices} == {80 * GIB}
    assert len({d.uuid for d in devices}) == 4
    assert all(UUID_RE.match(d.uuid) for d in devices)


def test_mixed_node_with_mig() -> None:
    spec = parse_sim_node(
        """
version: 1
devices:
  - {model: A100-SXM4-40GB, memory: 40GiB, count: 2, sharing_mode: exclusive}
  - model: A100-SXM4-80GB
    memory: 80GiB
    compute_capability: "8.0"
    mig:
      - {profile: 3g.40gb, memory: 40GiB}
      - {profile: 2g.20gb, memory: 20GiB}
"""
    )
    whole, mig = spec.devices[:2], spec.devices[2:]
    assert [d.index for d in whole] == [0, 1]
    assert all(d.sharing_mode is SharingMode.EXCLUSIVE for d in whole)
    assert [d.mig_profile for d in mig] == ["3g.40gb", "2g.20gb"]
    assert {d.index for d in mig} == {2}, "MIG instances keep their GPU's index"
    assert mig[0].parent_uuid is not None and mig[0].parent_uuid == mig[1].parent_uuid
    assert mig[0].uuid.startswith("MIG-") and mig[0].compute_capability == (8, 0)
    assert [d.memory_bytes for d in mig] == [40 * GIB, 20 * GIB]


BAD_NODES = [
    ("version: 2\ndevices: [{model: x, memory: 1GiB}]", "version"),
    ("version: 1\ndevices: []", "devices"),
    ("version: 1\ndevices: [{model: x}]", "devices[0].memory"),
    ("version: 1\ndevices: [{memory: 1GiB}]", "devices[0].model"),
    ("version: 1\ndevices: [{model: x, memory: lots}]", "devices[0].memory"),
    ("version: 1\ndevices: [{model: x, memory: 1GiB, count: 0}]", "devices[0].count"),
    ("version: 1\ndevices: [{model: x, memory: 1GiB, colour: red}]", "colour"),
    (
        "version: 1\ndevices: [{model: x, memory: 1GiB, sharing_mode: vgpu}]",
        "devices[0].sharing_mode",
    ),
    (
        "version: 1\ndevices: [{model: x, memory: 1GiB, mig: [{profile: a, memory: 2GiB}]}]",
        "devices[0].mig",
    ),
    (
        "version: 1\ndevices: [{model: x, memory: 8GiB, mig: [{profile: a}]}]",
        "devices[0].mig[0].memory",
    ),
    (
        "version: 1\ndevices: [{model: x, memory: 1GiB, compute_capability: nine}]",
        "compute_capability",
    ),
    ("[not, a, mapping]", "mapping"),
    ("version: 1\ndevices: [1\n", "YAML"),
    ("version: 1\ndevices: [{model: x, memory: 1GiB, count: 2, minor: [3]}]", "devices[0].minor"),
    ("version: 1\ndevices: [{model: x, memory: 1GiB, minor: 255}]", "devices[0].minor"),
    ("version: 1\ndevices: [{model: x, memory: 1GiB, minor: two}]", "devices[0].minor"),
    ("version: 1\ndevices: [{model: x, memory: 1GiB, count: 2, minor: [1, 1]}]", "twice"),
    (
        "version: 1\ndevices: [{model: x, memory: 1GiB, minor: 1}, {model: x, memory: 1GiB}]",
        "devices[1].minor: 1 is devices[0]'s",
    ),
]


def test_minor_numbers_default_to_the_index_and_may_differ_from_it() -> None:
    assert [d.minor for d in SimNodeSpec.default().devices] == [0, 1, 2, 3]
    spec = parse_sim_node(
        """
version: 1
devices:
  - {model: H100, memory: 80GiB, count: 2, minor: [2, 0]}
  - {model: H100, memory: 80GiB, minor: 1}
  - model: A100
    memory: 80GiB
    minor: 3
    mig:
      - {profile: 3g.40gb, memory: 40GiB}
      - {profile: 3g.40gb, memory: 40GiB}
"""
    )
    assert [(d.index, d.minor) for d in spec.devices] == [(0, 2), (1, 0), (2, 1), (3, 3), (3, 3)]
    migs = [d for d in spec.devices if d.is_mig]
    assert [(d.gpu_instance_id, d.compute_instance_id) for d in migs] == [(1, 0), (2, 0)]
    run = parse_sim_node("version: 1\ndevices: [{model: x, memory: 1GiB, count: 3, minor: 4}]")
    assert [d.minor for d in run.devices] == [4, 5, 6]


@pytest.mark.parametrize(("text", "named"), BAD_NODES)
def test_bad_node_files_name_the_problem(text: str, named: str) -> None:
    with pytest.raises(SimulationError, match=re.escape(named)):
        parse_sim_node(text)


def test_shipped_examples_parse() -> None:
    from pathlib import Path

    from agent.config import load_settings

    examples = Path(__file__).resolve().parents[3] / "examples"
    spec = parse_sim_node((examples / "node-mixed.yaml").read_text())
    assert len(spec.devices) == 4 and sum(d.is_mig for d in spec.devices) == 2
    load_settings((examples / "config.yaml").read_text())
