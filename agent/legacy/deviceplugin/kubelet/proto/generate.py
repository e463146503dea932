"""Regenerate the checked-in gRPC modules from the kubelet protos (needs the dev extra).

    python -m agent.legacy.deviceplugin.kubelet.proto.generate [OUTPUT_ROOT]

OUTPUT_ROOT defaults to the repository root; a test regenerates into a temporary folder
and checks that the result equals what is checked in. The protos are compiled with the
repository root as the include path, so the generated modules import each other as
``agent.legacy.deviceplugin.kubelet.proto....``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agent.kubelet.protoc import compile_protos

PROTOS = (
    "agent/legacy/deviceplugin/kubelet/proto/deviceplugin.proto",
    "agent/legacy/deviceplugin/kubelet/proto/podresources.proto",
)
MODULES = tuple(
    f"{Path(proto).stem}{suffix}"
    for proto in PROTOS
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
)


def generate(repo_root: Path, out_root: Path) -> None:
    compile_protos(repo_root, out_root, PROTOS)


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[5]
    generate(root, Path(sys.argv[1]) if len(sys.argv) > 1 else root)
