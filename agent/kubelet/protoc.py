"""The one way the agent compiles the kubelet's gRPC protos into checked-in modules (the
device plugin's and the DRA driver's): protoc with the repository root as the include
path, so the generated modules import each other by their package path."""

from __future__ import annotations

from pathlib import Path


def compile_protos(repo_root: Path, out_root: Path, protos: tuple[str, ...]) -> None:
    """protoc with the repository root as the include path: messages, stubs and types."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # dev-only dependency

    args = [
        "protoc",
        f"-I{repo_root}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(str(repo_root / proto) for proto in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
