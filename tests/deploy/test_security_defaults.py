"""The shipped configurations listen with TLS, close state and pipes, and reload on SIGHUP."""

from __future__ import annotations

import yaml

from tests.helpers import REPO


def shipped_configs() -> dict[str, dict[str, dict[str, object]]]:
    configmap = yaml.safe_load((REPO / "daemonset" / "configmap.yaml").read_text())
    return {
        "daemonset": yaml.safe_load(configmap["data"]["config.yaml"]),
        "systemd": yaml.safe_load((REPO / "systemd" / "config.yaml").read_text()),
    }


def test_every_shipped_tcp_listener_uses_mutual_tls() -> None:
    for name, config in shipped_configs().items():
        api = config["api"]
        assert api["tcp_listen"], name
        for key in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
            assert api.get(key), f"{name}: api.{key} is not set"
        assert not api.get("insecure_loopback"), name
        assert config["mps"]["client_group"] == "gpushare", name


def test_the_daemonset_mounts_the_certificate_it_configures() -> None:
    daemonset = yaml.safe_load((REPO / "daemonset" / "daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    secrets = {v["name"]: v.get("secret", {}) for v in pod["volumes"]}
    certificate = yaml.safe_load((REPO / "daemonset" / "certificate.yaml").read_text())
    assert secrets["tls"]["secretName"] == certificate["spec"]["secretName"]
    assert secrets["tls"]["defaultMode"] == 0o400 and secrets["token"]["defaultMode"] == 0o400
    api = shipped_configs()["daemonset"]["api"]
    assert str(api["tls_cert_file"]).startswith(mounts["tls"] + "/")
    assert (
        "groupadd --system --gid 2000 gpushare" in (REPO / "daemonset" / "Dockerfile").read_text()
    )


def test_the_unit_closes_state_and_reloads_on_sighup() -> None:
    unit = (REPO / "systemd" / "gpushare-agent.service").read_text()
    for line in ("StateDirectoryMode=0700", "UMask=0077", "ExecReload=/bin/kill -HUP $MAINPID"):
        assert line in unit
    assert "g gpushare -" in (REPO / "systemd" / "gpushare.sysusers").read_text()
