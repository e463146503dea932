"""A device named by index, UUID or unique UUID prefix; anything else lists the valid ones."""

from __future__ import annotations

import pytest

from agent.api.proto import agent_pb2 as pb
from agent.cli.devices import DeviceNameError, resolve_device

DEVICES = [
    pb.Device(index=0, uuid="GPU-87bb7b7c-d302-2d72-f82c-0e8cd08e8c23"),
    pb.Device(index=1, uuid="GPU-96222f07-1b1e-22e4-3d62-032b04d6aac6"),
    pb.Device(index=2, uuid="GPU-96e00000-0000-0000-0000-000000000000"),
    pb.Device(index=3, uuid="MIG-e9716899-33b1-3954-6089-2f59f9b65d6a"),
]


@pytest.mark.parametrize(
    ("name", "uuid_index"),
    [
        ("0", 0),
        ("3", 3),
        (" 1 ", 1),
        ("GPU-87bb7b7c-d302-2d72-f82c-0e8cd08e8c23", 0),
        ("gpu-87BB7B7C-d302-2d72-f82c-0e8cd08e8c23", 0),
        ("GPU-87b", 0),
        ("87b", 0),
        ("96222f", 1),
        ("MIG-e97", 3),
        ("e97", 3),
    ],
)
def test_a_name_designates_one_device(name: str, uuid_index: int) -> None:
    assert resolve_device(name, DEVICES) == DEVICES[uuid_index].uuid


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("9", "no device with index 9"),  # digits are an index, never the prefix of GPU-96...
        ("96", "no device with index 96"),
        ("GPU-96", "names 2 devices"),
        ("GPU-", "names 3 devices"),
        ("GPU-ffff", "no device 'GPU-ffff'"),
        ("", "no device ''"),
    ],
)
def test_a_name_that_fits_none_or_several_lists_the_valid_ones(name: str, says: str) -> None:
    with pytest.raises(DeviceNameError) as caught:
        resolve_device(name, DEVICES)
    assert says in str(caught.value)
    if "names" not in says:
        assert "0 (GPU-87bb7b7c-d302-2d72-f82c-0e8cd08e8c23)" in str(caught.value)
        assert "3 (MIG-e9716899" in str(caught.value)


def test_a_node_without_devices_says_so() -> None:
    with pytest.raises(DeviceNameError, match="this node has no devices"):
        resolve_device("0", [])
