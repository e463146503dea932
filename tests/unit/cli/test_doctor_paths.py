"""`gpushare doctor`'s verdicts per Kubernetes path (issue 39): a RuntimeClass read the
role refuses is a warning where GPU workload pods need the class and a skip where they do
not; a refused or missing Node names the fix for who asked; the shared shm directory not
mounted in the agent's pod, or closed to the clients, names the pod mount or the host's
chmod; the per-device tmpfs not seen in the pod names the mount propagation."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import pytest

from agent import doctor as pf
from agent.cli import doctor as doc
from agent.config import load_settings
from agent.doctor import DeviceShm, KubeFacts, PathFacts, ShmFacts, gather
from tests.kubeworld.apiserver import FakeApiServer

USER = "system:serviceaccount:gpushare-system:gpushare-agent"
API = KubeFacts(
    api="https://10.96.0.1:443",
    node_name="n1",
    node={"metadata": {"labels": {pf.GPU_PRESENT_LABEL: "true"}}},
    identity="the pod's service account",
    user=USER,
    driver=True,
)
REFUSED = dataclasses.replace(
    API,
    runtime_class_found=None,
    runtime_class_status=403,
    runtime_class_error='403 Forbidden: runtimeclasses.node.k8s.io "nvidia" is forbidden',
)


def jwt(claims: dict[str, object]) -> str:
    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


# -- the RuntimeClass -------------------------------------------------------------------------


def test_a_refused_runtime_class_read_is_a_warning_where_workloads_need_it() -> None:
    f = pf.check_runtime_class(REFUSED)
    assert f.status == "warn"
    assert f.found.startswith(
        "RuntimeClass nvidia not read from https://10.96.0.1:443: 403 Forbidden: runtimeclasses"
    )
    assert "; not checked (the pod's service account may not get runtimeclasses" in f.found
    assert f.fix.startswith("check it: `kubectl get runtimeclass nvidia`; to have the doctor")
    assert "apiGroups [node.k8s.io], resources [runtimeclasses], verbs [get]" in f.fix


def test_a_refused_runtime_class_read_is_skipped_where_no_workload_needs_it() -> None:
    f = pf.check_runtime_class(REFUSED, workloads_need_it=False)
    assert f.status == "skip" and not f.fix
    assert "not needed here: the claims' CDI specs carry the driver (nvidia-ctk)" in f.found


@pytest.mark.parametrize(
    ("facts", "status", "fix"),
    [
        (dataclasses.replace(API, runtime_class_found=True), "ok", ""),
        (dataclasses.replace(API, runtime_class_found=False), "fail", "create a RuntimeClass"),
        (
            dataclasses.replace(
                REFUSED, runtime_class_status=401, runtime_class_error="401 Unauthorized"
            ),
            "fail",
            "https://10.96.0.1:443 does not accept the pod's service account (401): give a",
        ),
        (
            dataclasses.replace(REFUSED, runtime_class_status=0),
            "fail",
            "the pod's service account must reach https://10.96.0.1:443: check the address",
        ),
    ],
)
def test_runtime_class_verdicts_that_do_not_depend_on_the_path(
    facts: KubeFacts, status: str, fix: str
) -> None:
    for need in (True, False):
        f = pf.check_runtime_class(facts, workloads_need_it=need)
        assert f.status == status and fix in f.fix


# -- the Node -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "driver", "fix"),
    [
        (404, True, "runtime.node_name (or --node) must be this node's Kubernetes name"),
        (
            403,
            True,
            "the pod's service account must get nodes, as the DRA driver reads its Node: bind "
            "it the chart's ClusterRole gpushare-dra-driver (deploy/dra/rbac.yaml; its rule "
            f"apiGroups [''], resources [nodes], verbs [get]); `kubectl auth can-i get nodes "
            f"--as={USER}`",
        ),
        (403, False, "the pod's service account may not get nodes: give --api-server"),
        (401, True, "https://10.96.0.1:443 does not accept the pod's service account (401)"),
        (0, False, "the pod's service account must reach https://10.96.0.1:443: check the"),
    ],
)
def test_an_unread_node_names_the_fix_for_who_asked(status: int, driver: bool, fix: str) -> None:
    facts = dataclasses.replace(
        API, node=None, node_status=status, node_error=f"{status} ...", driver=driver
    )
    for f in (pf.check_node_label(facts), pf.check_device_plugin(facts)):
        assert f.status == "fail" and fix in f.fix, f.fix


def test_token_user_reads_a_service_account_token() -> None:
    assert doc.token_user(jwt({"sub": USER, "iss": "k8s"}) + "\n") == USER
    assert doc.token_user(jwt({"iss": "k8s"})) == ""
    assert doc.token_user("0123abcd") == ""  # a bearer token that is no JWT
    assert doc.token_user("a.!!!.c") == ""
    assert doc.token_user(f"a.{base64.urlsafe_b64encode(b'[1]').decode()}.c") == ""


async def test_the_refusals_are_kept_with_their_status() -> None:
    async with FakeApiServer(token="t") as api:  # the stand-in serves no RuntimeClass
        api.fail_next("GET", "/api/v1/nodes/n1$", 403, reason="Forbidden", message="no")
        api.fail_next("GET", "/runtimeclasses/nvidia$", 403, reason="Forbidden", message="no")
        base = KubeFacts(node_name="n1", identity="x")
        facts = await doc._ask_kube(base, api.url, "t", "", 5.0)
    assert (facts.node, facts.node_status) == (None, 403)
    assert facts.runtime_class_found is None and facts.runtime_class_status == 403
    assert facts.runtime_class_error == "403 Forbidden: no"


def kube_facts(**settings: object) -> KubeFacts:
    return doc._kube_facts(
        load_settings(overrides=settings),
        api_server="",
        token_file="",
        ca_file="",
        node_name="n1",
        runtime_class="nvidia",
        timeout_s=1.0,
    )


def test_a_pod_without_a_token_says_why_per_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setattr(doc, "SERVICE_ACCOUNT_TOKEN", str(tmp_path / "token"))
    extender = kube_facts(**{"kubelet.enabled": True})
    assert extender.api == ""
    assert extender.why.startswith(
        "this pod has no service-account token: on the extender path the agent calls no "
        "Kubernetes API, so the chart mounts none; give --api-server and --api-token-file"
    )
    dra = kube_facts(**{"dra.enabled": True, "runtime.node_name": "n1"})
    assert "which the DRA driver needs (the chart projects one" in dra.why
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert kube_facts().why.startswith("not in a cluster")


def test_the_identity_named_is_the_token_the_doctor_used(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(jwt({"sub": USER}))
    settings = load_settings(overrides={"dra.api_server": "http://127.0.0.1:1"})
    facts = doc._kube_facts(
        dataclasses.replace(
            settings, dra=dataclasses.replace(settings.dra, api_token_file=str(token))
        ),
        api_server="",
        token_file="",
        ca_file="",
        node_name="n1",
        runtime_class="nvidia",
        timeout_s=0.5,
    )
    assert facts.identity == f"the token of dra.api_token_file {token}"
    assert facts.user == USER
    assert facts.node is None and facts.node_status == 0  # nothing listens there


def test_the_workloads_need_the_runtime_class_but_on_the_dra_path_with_the_toolkit(
    tmp_path: Path,
) -> None:
    ctk = tmp_path / "nvidia-ctk"
    ctk.write_text("#!/bin/sh\n")
    ctk.chmod(0o755)
    dra = {"dra.enabled": True, "dra.nvidia_ctk": str(ctk), "runtime.node_name": "n1"}
    cases = [
        (dra, "skip"),
        ({**dra, "kubelet.enabled": True}, "warn"),  # the extender path's pods need it
        ({**dra, "dra.nvidia_ctk": str(tmp_path / "none")}, "warn"),  # no CDI driver
    ]
    for overrides, status in cases:
        findings = doc.run_checks(
            load_settings(overrides={**overrides, "paths.runtime_dir": str(tmp_path)}),
            where=str(tmp_path / "agent.sock"),
            kube=lambda: REFUSED,
            timeout_s=0.5,
        )
        (f,) = [f for f in findings if f.check == "runtime-class"]
        assert f.status == status, (overrides, f)


# -- the shared shm directory seen from the agent's pod -------------------------------------------

SHARED = "/run/gpushare-shm"
SHM_ROOT = "/run/gpushare/shm"


def shared_facts(directory: PathFacts, *, in_pod: bool, dra: bool = False) -> ShmFacts:
    """No tmpfs per device (the chart's shm.size ""): every container gets ``directory``."""
    return ShmFacts(
        kubelet_enabled=not dra,
        kubelet_shm_dir="" if dra else SHARED,
        dra_enabled=dra,
        dra_shm_dir=SHARED if dra else "",
        directory=directory,
        in_pod=in_pod,
    )


@pytest.mark.parametrize("dra", [False, True])
def test_a_shared_directory_not_mounted_in_the_pod(dra: bool) -> None:
    f = pf.check_shm(shared_facts(PathFacts(SHARED, False), in_pod=True, dra=dra))
    key = "dra.shm_dir" if dra else "kubelet.shm_dir"
    assert f.status == "fail"
    assert f.found.startswith(f"{SHARED} is not in this pod ({key}): the /dev/shm of the")
    assert f.fix.startswith(
        f"mount the host's {SHARED} into the agent's pod at the same path (hostPath, read-only "
        "will do: the chart's shm.hostPath, which the mps-host pod mounts at /dev/shm), or run "
        f"the doctor on the host; where the host lacks it too: mkdir -p {SHARED}"
    )


def test_a_shared_directory_missing_on_the_host() -> None:
    f = pf.check_shm(shared_facts(PathFacts(SHARED, False), in_pod=False))
    assert (f.status, f.found) == ("fail", f"{SHARED} does not exist (kubelet.shm_dir)")
    assert f.fix.startswith(f"mkdir -p {SHARED} && chmod 1777 {SHARED}")


@pytest.mark.parametrize(("in_pod", "where"), [(True, " (on the host)"), (False, "")])
def test_a_shared_directory_closed_to_the_clients(in_pod: bool, where: str) -> None:
    closed = PathFacts(SHARED, True, is_dir=True, mode=0o755, uid=0, gid=0)
    f = pf.check_shm(shared_facts(closed, in_pod=in_pod))
    assert f.status == "fail" and f.fix == f"chmod 1777 {SHARED}{where}"


def test_a_legacy_daemon_with_the_shared_directory_not_in_the_pod() -> None:
    legacy = DeviceShm("GPU-1", f"{SHM_ROOT}/GPU-1", "legacy", "daemon 7 has no record")
    facts = dataclasses.replace(
        shared_facts(PathFacts(SHARED, False), in_pod=True),
        shm_root=SHM_ROOT,
        root=PathFacts(SHM_ROOT, True, is_dir=True, mode=0o700),
        devices=(legacy,),
    )
    f = pf.check_shm(facts)
    assert f.status == "fail"
    assert f.found.startswith(f"GPU-1: daemon 7 has no record; {SHARED} is not in this pod")
    assert f.fix.startswith(f"mount the host's {SHARED} into the agent's pod")
    unused = pf.check_shm(dataclasses.replace(facts, devices=()))  # no daemon uses it
    assert unused.status == "ok"


@pytest.mark.parametrize(("in_pod", "fix"), [(True, "mountPropagation"), (False, "the same way")])
def test_a_device_tmpfs_the_pod_does_not_see(in_pod: bool, fix: str) -> None:
    mismatch = DeviceShm("GPU-1", f"{SHM_ROOT}/GPU-1", "mismatch", "daemon 7 should have")
    facts = dataclasses.replace(
        shared_facts(PathFacts(SHARED, True, is_dir=True, mode=0o1777), in_pod=in_pod),
        shm_root=SHM_ROOT,
        root=PathFacts(SHM_ROOT, True, is_dir=True, mode=0o700),
        devices=(mismatch,),
    )
    f = pf.check_shm(facts)
    assert f.status == "fail" and fix in f.fix
    if in_pod:
        assert f.fix == (
            f"mount the host directory that holds {SHM_ROOT} into the agent's pod with "
            "mountPropagation Bidirectional (or HostToContainer), so that it sees the tmpfs "
            "the mps-host pod mounts there (Bidirectional: the chart's run volume)"
        )


def test_in_pod_is_what_the_kubelet_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert gather.in_pod() is False
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert gather.in_pod() is True
