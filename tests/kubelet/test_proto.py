"""The checked-in kubelet gRPC modules: current, importable by their package names, and
naming the services as the kubelet does."""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path

from agent.legacy.deviceplugin.kubelet.proto.generate import MODULES, generate
from tests.helpers import REPO

PROTO_DIR = REPO / "agent" / "legacy" / "deviceplugin" / "kubelet" / "proto"


def test_generated_kubelet_grpc_code_is_up_to_date() -> None:
    with tempfile.TemporaryDirectory() as out:
        generate(REPO, Path(out))
        fresh = Path(out) / "agent" / "legacy" / "deviceplugin" / "kubelet" / "proto"
        assert sorted(p.name for p in fresh.iterdir()) == sorted(MODULES)
        for name in MODULES:
            checked_in = (PROTO_DIR / name).read_text()
            assert (fresh / name).read_text() == checked_in, (
                f"{name} is stale: run python -m agent.legacy.deviceplugin.kubelet.proto.generate"
            )


def test_generated_modules_import_by_package_name() -> None:
    for name in MODULES:
        if name.endswith(".py"):
            module = importlib.import_module(
                f"agent.legacy.deviceplugin.kubelet.proto.{name.removesuffix('.py')}"
            )
            assert module.__name__.startswith("agent.legacy.deviceplugin.kubelet.proto.")
    grpc_sources = [(PROTO_DIR / n).read_text() for n in MODULES if n.endswith("_grpc.py")]
    for source in grpc_sources:
        assert "from agent.legacy.deviceplugin.kubelet.proto import " in source


def test_services_have_the_kubelet_wire_names() -> None:
    from agent.legacy.deviceplugin.kubelet.proto import deviceplugin_pb2, podresources_pb2

    dp = deviceplugin_pb2.DESCRIPTOR
    pr = podresources_pb2.DESCRIPTOR
    assert dp.package == "v1beta1"
    assert pr.package == "v1"
    assert [m.name for m in dp.services_by_name["Registration"].methods] == ["Register"]
    assert [m.name for m in dp.services_by_name["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert [m.full_name for m in pr.services_by_name["PodResourcesLister"].methods] == [
        "v1.PodResourcesLister.List",
        "v1.PodResourcesLister.GetAllocatableResources",
        "v1.PodResourcesLister.Get",
    ]


def test_the_protos_keep_no_gogoproto() -> None:
    for name in ("deviceplugin.proto", "podresources.proto"):
        text = (PROTO_DIR / name).read_text()
        assert 'import "github.com/gogo' not in text
        assert "(gogoproto." not in text
