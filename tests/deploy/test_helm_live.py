"""What the chart does only where Helm talks to a cluster, run for real: Helm's own install
and upgrade against a loopback API stand-in (tests/deploy/helm_cluster.py), so ``lookup``
reads what the cluster holds.

- The upgrade guard (templates/_helpers.tpl, gpushare.nodeSelector) reads the running MPS
  host DaemonSet: an upgrade that would select other nodes than it does is refused, naming
  how to label them; with nodeSelectorMigrated, or when the live DaemonSet already selects
  the new nodes (which the offline branch would refuse), it goes through.
- The token Secret and the generated certificates are read back on upgrade and kept; a
  certificate near expiry is renewed by the upgrade with the same CA; a CA near expiry
  renews everything.
- Switching an install from cert-manager to generated certificates is refused by Helm
  while cert-manager's Secrets (not Helm's) hold the names: docs/install.md says to delete
  them first, and then it works."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path

import helm_python
import pytest

from tests.deploy.helm_cluster import Helm, HelmCluster, Obj, helm_on
from tests.deploy.test_chart import CHART

NAMESPACE = "team-gpu"
OLD_SELECTOR = {"nvidia.com/gpu.present": "true"}
NEW_SELECTOR = {"gpushare.io/node": "true"}
DRA = {"path": "dra", "certificates": {"mode": "generated"}}
LEAVES = ("gpushare-agent-tls", "gpushare-dra-controller-agent-tls")


@pytest.fixture
def cluster() -> Iterator[HelmCluster]:
    with HelmCluster() as stand_in:
        yield stand_in


@pytest.fixture
def helm(cluster: HelmCluster) -> Iterator[Helm]:
    with helm_on(cluster, str(CHART), NAMESPACE, "gpushare") as client:
        yield client


def mps_host_selector(cluster: HelmCluster) -> dict[str, str]:
    daemonset = cluster.get("apps/v1", "daemonsets", NAMESPACE, "gpushare-mps-host")
    assert daemonset is not None
    return daemonset["spec"]["template"]["spec"]["nodeSelector"]  # type: ignore[no-any-return]


def secret(cluster: HelmCluster, name: str) -> Obj:
    found = cluster.get("v1", "secrets", NAMESPACE, name)
    assert found is not None, name
    return found


def pem(obj: Obj, key: str) -> bytes:
    return base64.b64decode(obj["data"][key])


# -- the upgrade guard, live ------------------------------------------------------------


def test_an_upgrade_off_the_nodes_the_live_daemonset_selects_is_refused_naming_the_fix(
    cluster: HelmCluster, helm: Helm
) -> None:
    helm.install({**DRA, "nodeSelector": OLD_SELECTOR})  # as the previous chart selected
    assert mps_host_selector(cluster) == OLD_SELECTOR
    cluster.requests.clear()
    with pytest.raises(helm_python.HelmError) as refused:
        helm.upgrade(DRA)  # the new default: gpushare.io/node=true
    said = str(refused.value)
    assert 'the running MPS host DaemonSet selects {"nvidia.com/gpu.present":"true"}' in said
    assert "kubectl label node NODE gpushare.io/node=true" in said
    assert "nodeSelectorMigrated=true" in said
    asked = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/gpushare-mps-host"
    assert ("GET", asked) in cluster.requests  # lookup read the live object
    assert mps_host_selector(cluster) == OLD_SELECTOR  # nothing applied

    helm.upgrade({**DRA, "nodeSelectorMigrated": True})
    assert mps_host_selector(cluster) == NEW_SELECTOR


def test_an_upgrade_keeping_the_nodes_is_allowed(cluster: HelmCluster, helm: Helm) -> None:
    helm.install({**DRA, "nodeSelector": OLD_SELECTOR})
    helm.upgrade({**DRA, "nodeSelector": OLD_SELECTOR})
    assert mps_host_selector(cluster) == OLD_SELECTOR


def test_an_upgrade_of_a_release_on_the_new_label_is_allowed(
    cluster: HelmCluster, helm: Helm
) -> None:
    """Offline the guard refuses the default label on every upgrade (it cannot know what
    runs); against the cluster it sees the DaemonSet already selects it."""
    helm.install(DRA)
    assert mps_host_selector(cluster) == NEW_SELECTOR
    helm.upgrade(DRA)
    assert mps_host_selector(cluster) == NEW_SELECTOR


# -- what is read back ------------------------------------------------------------------


def test_the_token_and_the_certificates_are_kept_across_an_upgrade(
    cluster: HelmCluster, helm: Helm
) -> None:
    helm.install(DRA)
    before = {
        name: secret(cluster, name)["data"]
        for name in ("gpushare-agent-token", "gpushare-ca", *LEAVES)
    }
    assert len(pem(secret(cluster, "gpushare-agent-token"), "token")) >= 32
    helm.upgrade(DRA)
    after = {name: secret(cluster, name)["data"] for name in before}
    assert after == before


def near_expiry(cluster: HelmCluster, name: str) -> None:
    """The Secret's certificate as though it expired in a day (within renewBeforeDays)."""
    obj = secret(cluster, name)
    obj["metadata"]["annotations"]["gpushare.io/not-after"] = "2000-01-01T00:00:00Z"
    cluster.put(obj)


def verifies(ca: bytes, leaf: bytes, tmp: Path) -> bool:
    (tmp / "ca.pem").write_bytes(ca)
    (tmp / "leaf.pem").write_bytes(leaf)
    done = subprocess.run(
        ["openssl", "verify", "-CAfile", "ca.pem", "leaf.pem"],
        cwd=tmp, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return done.returncode == 0


def test_an_upgrade_renews_a_certificate_near_expiry_with_the_same_ca(
    cluster: HelmCluster, helm: Helm, tmp_path: Path
) -> None:
    helm.install(DRA)
    ca = secret(cluster, "gpushare-ca")["data"]
    controller = secret(cluster, LEAVES[1])["data"]
    old_agent = pem(secret(cluster, LEAVES[0]), "tls.crt")
    near_expiry(cluster, LEAVES[0])
    helm.upgrade(DRA)
    agent = secret(cluster, LEAVES[0])
    assert pem(agent, "tls.crt") != old_agent  # renewed
    assert secret(cluster, "gpushare-ca")["data"] == ca  # the same CA
    assert secret(cluster, LEAVES[1])["data"] == controller  # the others kept
    assert agent["metadata"]["annotations"]["gpushare.io/not-after"] > "2001"
    # peers still holding the old files trust the new certificate, and the old one
    assert pem(agent, "ca.crt") == pem(secret(cluster, "gpushare-ca"), "tls.crt")
    assert verifies(base64.b64decode(ca["tls.crt"]), pem(agent, "tls.crt"), tmp_path)
    assert verifies(base64.b64decode(ca["tls.crt"]), old_agent, tmp_path)


def test_a_ca_near_expiry_renews_every_certificate(cluster: HelmCluster, helm: Helm) -> None:
    helm.install(DRA)
    before = {name: secret(cluster, name)["data"]["tls.crt"] for name in ("gpushare-ca", *LEAVES)}
    near_expiry(cluster, "gpushare-ca")
    helm.upgrade(DRA)
    ca = secret(cluster, "gpushare-ca")["data"]["tls.crt"]
    assert ca != before["gpushare-ca"]
    for name in LEAVES:
        leaf = secret(cluster, name)
        assert leaf["data"]["tls.crt"] != before[name] and leaf["data"]["ca.crt"] == ca


def test_switching_from_cert_manager_needs_its_secrets_deleted_first(
    cluster: HelmCluster, helm: Helm
) -> None:
    helm.install({"path": "dra"})  # certManager, the default
    # what cert-manager made from the Certificates: Secrets that are not Helm's
    for name in LEAVES:
        cluster.put(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "type": "kubernetes.io/tls",
                "data": {"tls.crt": "", "tls.key": "", "ca.crt": ""},
            }
        )
    with pytest.raises(helm_python.HelmError, match="gpushare-agent-tls"):
        helm.upgrade(DRA)
    for name in LEAVES:  # docs/install.md: delete them, then upgrade
        del cluster.objects[("v1", "secrets", NAMESPACE, name)]
    helm.upgrade(DRA)
    assert secret(cluster, LEAVES[0])["metadata"]["annotations"]["gpushare.io/certificate-for"]
