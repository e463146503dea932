"""Regenerate the checked-in NRI message modules from the protos (needs the dev extra).

    python -m agent.legacy.deviceplugin.nri.proto.generate [OUTPUT_ROOT]

OUTPUT_ROOT defaults to the repository root; a test regenerates into a temporary folder
and checks that the result equals what is checked in. NRI speaks ttrpc, not gRPC: only
the messages are generated, the calls are framed by :mod:`agent.legacy.deviceplugin.nri.wire`.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTOS = (
    "agent/legacy/deviceplugin/nri/proto/ttrpc.proto",
    "agent/legacy/deviceplugin/nri/proto/nri.proto",
)
MODULES = tuple(
    f"{Path(proto).stem}{suffix}" for proto in PROTOS for suffix in ("_pb2.py", "_pb2.pyi")
)


def generate(repo_root: Path, out_root: Path) -> None:
    from grpc_tools import protoc  # dev-only dependency

    args = [
        "protoc",
        f"-I{repo_root}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        *(str(repo_root / proto) for proto in PROTOS),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[5]
    generate(root, Path(sys.argv[1]) if len(sys.argv) > 1 else root)
