"""The checked-in DRA gRPC modules: current, importable by their package names, naming the
services as the kubelet calls them, and the protos the kubelet's own, license kept."""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path

from agent.dra.proto.generate import MODULES, PROTOS, generate
from tests.helpers import REPO

PROTO_DIR = REPO / "agent" / "dra" / "proto"


def test_generated_dra_grpc_code_is_up_to_date() -> None:
    with tempfile.TemporaryDirectory() as out:
        generate(REPO, Path(out))
        fresh = Path(out) / "agent" / "dra" / "proto"
        assert sorted(p.name for p in fresh.iterdir()) == sorted(MODULES)
        for name in MODULES:
            assert (fresh / name).read_text() == (PROTO_DIR / name).read_text(), (
                f"{name} is stale: run python -m agent.dra.proto.generate"
            )


def test_generated_modules_import_by_package_name() -> None:
    for name in MODULES:
        if name.endswith("_grpc.py"):
            source = (PROTO_DIR / name).read_text()
            assert "from agent.dra.proto import " in source
        if name.endswith(".py"):
            importlib.import_module(f"agent.dra.proto.{name.removesuffix('.py')}")


def test_services_have_the_kubelet_wire_names() -> None:
    from agent.dra.proto import (
        dra_v1_pb2,
        dra_v1beta1_pb2,
        health_v1_pb2,
        health_v1alpha1_pb2,
        registration_pb2,
    )

    names = {
        dra_v1_pb2: "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        dra_v1beta1_pb2: "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
        health_v1_pb2: "v1.DRAResourceHealth",
        health_v1alpha1_pb2: "v1alpha1.DRAResourceHealth",
        registration_pb2: "pluginregistration.Registration",
    }
    for module, service in names.items():
        [found] = module.DESCRIPTOR.services_by_name.values()
        assert found.full_name == service


def test_each_proto_names_its_source_and_keeps_the_license() -> None:
    for proto in PROTOS:
        text = (REPO / proto).read_text()
        assert "(Apache License 2.0; Copyright The Kubernetes Authors)" in text
    assert "Apache License" in (PROTO_DIR / "LICENSE").read_text()
