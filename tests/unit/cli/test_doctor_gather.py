"""`gpushare doctor`'s facts as gathered: the MPS directories and the control binary from
real files, and the Kubernetes questions asked of the stand-in API server."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from aiohttp import web

from agent import doctor as pf
from agent.cli import doctor as doc
from agent.config import load_settings
from agent.doctor import BinaryFacts, KubeFacts, gather
from tests.kubeworld.apiserver import FakeApiServer

# -- gathered from real files ------------------------------------------------------------------


def test_mps_dir_facts_read_the_directories(tmp_path: Path) -> None:
    gid = os.getgid()
    settings = load_settings(overrides={"paths.runtime_dir": str(tmp_path), "mps.client_gid": gid})
    base = tmp_path / "mps" / "GPU-1"
    for sub in ("pipe", "log"):
        (base / sub).mkdir(parents=True)
        (base / sub).chmod(0o750)
    (tmp_path / "mps").chmod(0o755)
    base.chmod(0o755)
    (tmp_path / "mps" / "stray-file").write_text("")
    facts = gather.mps_dir_facts(settings, agent_running=True)
    assert [x.uuid for x in facts.devices] == ["GPU-1"]
    assert facts.agent_uid == os.geteuid() and facts.client_gid == gid
    assert pf.check_mps_dirs(facts).status == "ok"
    (base / "pipe").chmod(0o770)
    f = pf.check_mps_dirs(gather.mps_dir_facts(settings, agent_running=True))
    assert f.status == "fail" and f"{base}/pipe is 0770" in f.found


def test_a_missing_client_group_is_reported(tmp_path: Path) -> None:
    settings = load_settings(
        overrides={"paths.runtime_dir": str(tmp_path), "mps.client_group": "no-such-group-x"}
    )
    facts = gather.mps_dir_facts(settings, agent_running=False)
    assert facts.client_gid is None and facts.group_missing


def test_binary_facts(tmp_path: Path) -> None:
    binary = tmp_path / "nvidia-cuda-mps-control"
    binary.write_bytes(b"\x7fELF\x00535.309.01\x00rest")
    binary.chmod(0o755)
    settings = load_settings(overrides={"mps.control_binary": str(binary)})
    facts = gather.binary_facts(settings, simulated=False)
    assert facts == BinaryFacts(str(binary), str(binary), True, "535.309.01", False)
    missing = load_settings(overrides={"mps.control_binary": str(tmp_path / "none")})
    assert gather.binary_facts(missing, simulated=False).path == ""


# -- the Kubernetes API ------------------------------------------------------------------------


async def test_kube_facts_from_an_api_server() -> None:
    async def runtime_class(request: web.Request) -> web.Response:
        if request.match_info["name"] != "nvidia":
            return web.json_response(
                {"kind": "Status", "code": 404, "reason": "NotFound", "message": "not found"},
                status=404,
            )
        return web.json_response({"kind": "RuntimeClass", "handler": "nvidia"})

    api = FakeApiServer(token="t")  # and one route the stand-in does not serve:
    api.app.router.add_get("/apis/node.k8s.io/v1/runtimeclasses/{name}", runtime_class)
    async with api:
        api.create_node("n1", labels={pf.GPU_PRESENT_LABEL: "true"})
        base = KubeFacts(node_name="n1", runtime_class="nvidia")
        facts = await doc._ask_kube(base, api.url, "t", "", 5.0)
        assert facts.api == api.url and facts.runtime_class_found is True
        assert [pf.check_node_label(facts).status, pf.check_runtime_class(facts).status] == [
            "ok",
            "ok",
        ]
        other = dataclasses.replace(base, node_name="n2", runtime_class="nvidia-cdi")
        facts = await doc._ask_kube(other, api.url, "t", "", 5.0)
        assert facts.runtime_class_found is False
        assert pf.check_node_label(facts).status == "fail"
        assert "not read from" in pf.check_node_label(facts).found
        refused = await doc._ask_kube(base, api.url, "wrong", "", 5.0)
        assert refused.node is None and refused.runtime_class_found is None
        assert "Unauthorized" in pf.check_runtime_class(refused).found


def test_no_api_skips_the_kubernetes_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    facts = doc._kube_facts(
        load_settings(overrides={}),
        api_server="",
        token_file="",
        ca_file="",
        node_name="n1",
        runtime_class="nvidia",
        timeout_s=1.0,
    )
    assert facts.api == "" and "neither --api-server nor dra.api_server" in facts.why
