"""A hook Job's pod, simulated for its command run as a real process: the service account's
files (a token and the API server's CA), the pod's environment, and the server side of the
API stand-in's TLS (tests.kubeworld.apiserver.FakeApiServer, ``ssl_context``)."""

from __future__ import annotations

import os
import shutil
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.certs import make_pki, make_token
from tests.helpers import subprocess_env

# Loaded in the Job's process (PYTHONPATH) before the CLI: the service account's files from
# GPUSHARE_TEST_SERVICE_ACCOUNT instead of SERVICE_ACCOUNT, where a pod has them. Only
# their place changes; the command still finds them as it does in a pod.
SITECUSTOMIZE = """\
import os

_root = os.environ.get("GPUSHARE_TEST_SERVICE_ACCOUNT")
if _root:
    from agent.kubeapi.connection import ApiConnection

    ApiConnection.in_cluster.__func__.__kwdefaults__.update(
        token_file=os.path.join(_root, "token"), ca_file=os.path.join(_root, "ca.crt")
    )
"""


@dataclass(frozen=True)
class JobPod:
    token: str  # the service account's bearer token, which the stand-in requires
    server_tls: ssl.SSLContext  # the stand-in's certificate, signed by the account's CA
    account: Path  # what a pod has at agent.kubeapi.connection.SERVICE_ACCOUNT
    shim: Path  # the folder holding SITECUSTOMIZE as sitecustomize.py

    def env(self, api_url: str, container: dict[str, Any]) -> dict[str, str]:
        """The pod's environment for ``container``: the kubelet's KUBERNETES_SERVICE_HOST and
        _PORT for ``api_url``, the container's own env, no GPUSHARE_KUBE_API_SERVER."""
        env = subprocess_env()
        env.pop("GPUSHARE_KUBE_API_SERVER", None)
        env["PYTHONPATH"] = f"{self.shim}{os.pathsep}{env['PYTHONPATH']}"
        env["GPUSHARE_TEST_SERVICE_ACCOUNT"] = str(self.account)
        host, _, port = api_url.removeprefix("https://").rpartition(":")
        env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"] = host, port
        for item in container.get("env", []):
            env[item["name"]] = item["value"]
        return env


def make_job_pod(root: Path) -> JobPod:
    """A fresh PKI, service account and shim under ``root``."""
    pki = make_pki(root / "pki")
    account = root / "serviceaccount"
    account.mkdir(parents=True)
    token = make_token(account / "token")
    shutil.copy(pki.ca, account / "ca.crt")
    shim = root / "shim"
    shim.mkdir(parents=True)
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(pki.server_cert, pki.server_key)
    return JobPod(token=token, server_tls=server_tls, account=account, shim=shim)
