"""Real certificates made at test time with the ``openssl`` CLI, and secret files with the
modes the agent accepts."""

from __future__ import annotations

import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path


def make_token(path: Path, token: str | None = None) -> str:
    """Write a fresh 256-bit hex token (or ``token``) to ``path`` with mode 0600."""
    value = token or secrets.token_hex(32)
    path.write_text(value + "\n")
    os.chmod(path, 0o600)
    return value


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate."""

    root: Path

    @property
    def ca(self) -> Path:
        return self.root / "ca.crt"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.root / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.root / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.root / "client.key"

    def read(self, path: Path) -> bytes:
        return path.read_bytes()


def _leaf(root: Path, name: str, subject: str, extensions: str) -> None:
    (root / f"{name}.ext").write_text(extensions)
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
        cwd=root,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
        cwd=root,
    )  # fmt: skip
    os.chmod(root / f"{name}.key", 0o600)


def make_pki(root: Path, *, name: str = "gpushare test") -> Pki:
    """Create the CA, server and client certificates in ``root`` (created if missing)."""
    root.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", f"/CN={name} CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=root,
    )  # fmt: skip
    _leaf(
        root,
        "server",
        "/CN=gpushare-agent",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    _leaf(root, "client", "/CN=gpu-scheduler", "extendedKeyUsage=clientAuth\n")
    return Pki(root)


def make_client(pki: Pki, name: str, common_name: str) -> tuple[Path, Path]:
    """Another client certificate of the same CA: (certificate, key)."""
    _leaf(pki.root, name, f"/CN={common_name}", "extendedKeyUsage=clientAuth\n")
    return pki.root / f"{name}.crt", pki.root / f"{name}.key"
