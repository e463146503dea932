"""``RestKubeApi`` against the stand-in API server: every ``KubeApi`` method, the raw JSON
it returns, the content types it sends, how errors and broken connections are translated,
its configuration (watches: :mod:`tests.kube.test_rest_adapter_watch`)."""

from __future__ import annotations

import inspect
import socket
import ssl
from datetime import timedelta
from pathlib import Path

import pytest

from agent.core.errors import ConfigError
from agent.kubeapi.connection import proxy_from_env
from agent.kubeapi.port import (
    Conflict,
    Gone,
    KubeApi,
    KubeError,
    NotFound,
    Obj,
    ResourceApi,
)
from agent.kubeapi.rest import RestKubeApi
from tests.certs import make_pki, make_token
from tests.kubeworld.apiserver import JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, FakeApiServer

TOKEN = "adapter-test-token"
NS = "team-a"
FINALIZER = "gpushare.io/lease"
MINE = "spec.schedulerName=gpushare"


@pytest.mark.parametrize(("port", "count"), [(KubeApi, 14), (ResourceApi, 11)])
def test_it_has_every_method_of_the_ports_with_their_signatures(port: type, count: int) -> None:
    methods = [n for n in vars(port) if not n.startswith("_") and callable(vars(port)[n])]
    assert len(methods) == count
    for name in methods:
        theirs, ours = (
            inspect.signature(getattr(port, name)),
            inspect.signature(getattr(RestKubeApi, name)),
        )
        assert list(ours.parameters.values()) == list(theirs.parameters.values()), name
        # a watch is a plain method answering an async iterator; every other call a coroutine
        is_watch = name.startswith("watch_")
        assert inspect.iscoroutinefunction(getattr(RestKubeApi, name)) != is_watch, name


def patch_content_types(api: FakeApiServer) -> list[str]:
    return [content_type for method, _, content_type in api.log if method == "PATCH"]


# -- reads ---------------------------------------------------------------------------------


async def test_get_pod_returns_the_servers_json(api: FakeApiServer, kube: RestKubeApi) -> None:
    api.create_pod("p", NS, annotations={"gpushare.io/memory": "20Gi"})
    pod = await kube.get_pod(NS, "p")
    assert pod == api.pod(NS, "p")  # exactly: camelCase keys, no model round trip
    assert pod["metadata"]["creationTimestamp"].endswith("Z")
    assert api.log[-1][:2] == ("GET", f"/api/v1/namespaces/{NS}/pods/p")


async def test_a_missing_pod_is_not_found(kube: RestKubeApi) -> None:
    with pytest.raises(NotFound) as caught:
        await kube.get_pod(NS, "nope")
    assert (caught.value.status, caught.value.reason) == (404, "NotFound")
    assert 'pods "nope" not found' in str(caught.value)


async def test_list_pods_with_selectors_and_its_resource_version(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    api.create_pod("mine", NS, scheduler_name="gpushare", labels={"app": "train"})
    api.create_pod("bound", "team-b", scheduler_name="gpushare", node_name="n1")
    api.create_pod("other", NS, labels={"app": "train"})
    listing = await kube.list_pods(field_selector=MINE)
    assert sorted(p["metadata"]["name"] for p in listing.items) == ["bound", "mine"]
    assert listing.resource_version == api.resource_version == "3"
    listing = await kube.list_pods(field_selector=f"{MINE},spec.nodeName=", label_selector="app")
    assert [p["metadata"]["name"] for p in listing.items] == ["mine"]
    listing = await kube.list_pods()
    assert len(listing.items) == 3
    assert api.requests["list"] == 3


async def test_list_endpoint_slices_of_one_service(api: FakeApiServer, kube: RestKubeApi) -> None:
    api.set_endpoints("gpushare-system", "gpushare-agent", [("n1", "10.0.0.1")], port=50051)
    api.set_endpoints("gpushare-system", "unrelated", [("n2", "10.0.0.2")], port=80)
    api.set_endpoints("elsewhere", "gpushare-agent", [("n3", "10.0.0.3")], port=50051)
    slices = await kube.list_endpoint_slices("gpushare-system", "gpushare-agent")
    assert [e["nodeName"] for s in slices for e in s["endpoints"]] == ["n1"]
    assert slices[0]["ports"][0] == {"name": "grpc", "port": 50051, "protocol": "TCP"}
    assert await kube.list_endpoint_slices("gpushare-system", "none") == []


# -- writes --------------------------------------------------------------------------------


async def test_patch_pod_sends_each_kind_with_its_content_type(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    api.create_pod("p", NS, finalizers=[FINALIZER, "other"])
    pod = await kube.patch_pod(NS, "p", {"metadata": {"annotations": {"gpushare.io/lease": "L1"}}})
    assert pod["metadata"]["annotations"] == {"gpushare.io/lease": "L1"}
    ops: list[Obj] = [{"op": "remove", "path": "/metadata/finalizers/1"}]
    pod = await kube.patch_pod(NS, "p", ops, kind="json")
    assert pod["metadata"]["finalizers"] == [FINALIZER]
    pod = await kube.patch_pod(NS, "p", {"metadata": {"labels": {"a": "b"}}}, kind="strategic")
    assert pod["metadata"]["labels"] == {"a": "b"}
    assert patch_content_types(api) == [MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH]
    assert api.pod(NS, "p") == pod


async def test_a_stale_patch_is_a_conflict_and_a_failing_test_op_a_kube_error(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    pod = api.create_pod("p", NS, finalizers=[FINALIZER])
    stale = pod["metadata"]["resourceVersion"]
    api.set_pod_phase(NS, "p", "Running")
    with pytest.raises(Conflict) as caught:
        await kube.patch_pod(NS, "p", {"metadata": {"finalizers": [], "resourceVersion": stale}})
    assert (caught.value.status, caught.value.reason) == (409, "Conflict")
    test_op: list[Obj] = [{"op": "test", "path": "/status/phase", "value": "Pending"}]
    with pytest.raises(KubeError) as failed:
        await kube.patch_pod(NS, "p", test_op, kind="json")
    assert type(failed.value) is KubeError
    assert (failed.value.status, failed.value.reason) == (422, "Invalid")
    with pytest.raises(NotFound):
        await kube.patch_pod(NS, "gone", {"metadata": {"labels": {"a": "b"}}})


async def test_bind_pod_sets_the_node_and_a_second_bind_conflicts(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    pod = api.create_pod("p", NS, scheduler_name="gpushare")
    uid = pod["metadata"]["uid"]
    await kube.bind_pod(NS, "p", uid, "n1")
    assert api.pod(NS, "p")["spec"]["nodeName"] == "n1"  # type: ignore[index]
    with pytest.raises(Conflict, match='already assigned to node "n1"'):
        await kube.bind_pod(NS, "p", uid, "n2")
    with pytest.raises(NotFound):
        await kube.bind_pod(NS, "nope", "", "n1")

    api.create_pod("q", NS)  # a pod of the same name made again: the old uid must not bind it
    with pytest.raises(Conflict, match="Precondition failed: UID"):
        await kube.bind_pod(NS, "q", uid, "n1")
    await kube.bind_pod(NS, "q", "", "n1")
    assert api.pod(NS, "q")["spec"]["nodeName"] == "n1"  # type: ignore[index]


async def test_delete_pod_takes_only_the_pod_of_that_uid(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    old = api.create_pod("p", NS)
    api.delete_pod(NS, "p", force=True)
    api.create_pod("p", NS)  # made again under the same name
    with pytest.raises(Conflict, match="Precondition failed"):
        await kube.delete_pod(NS, "p", uid=old["metadata"]["uid"])
    assert api.pod(NS, "p") is not None
    current = api.pod(NS, "p")
    assert current is not None
    await kube.delete_pod(NS, "p", uid=current["metadata"]["uid"])
    gone = api.pod(NS, "p")
    assert gone is None or gone["metadata"].get("deletionTimestamp")
    with pytest.raises(NotFound):
        await kube.delete_pod(NS, "nope", uid="x")


async def test_patch_node_merges_labels_and_patch_node_status_merges_conditions(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    api.create_node("n1", labels={"zone": "a"})
    node = await kube.patch_node("n1", {"metadata": {"labels": {"gpushare.io/agent": "ready"}}})
    assert node["metadata"]["labels"] == {
        "kubernetes.io/hostname": "n1",
        "zone": "a",
        "gpushare.io/agent": "ready",
    }
    condition = {"type": "GpushareAgentReady", "status": "False", "reason": "Unreachable"}
    node = await kube.patch_node_status("n1", {"status": {"conditions": [condition]}})
    types = [c["type"] for c in node["status"]["conditions"]]
    assert types == ["Ready", "MemoryPressure", "GpushareAgentReady"]  # merged by type
    node = await kube.patch_node_status(
        "n1", {"status": {"conditions": [{**condition, "status": "True"}]}}
    )
    assert node["status"]["conditions"][2]["status"] == "True"
    assert len(node["status"]["conditions"]) == 3
    assert patch_content_types(api) == [MERGE_PATCH, STRATEGIC_PATCH, STRATEGIC_PATCH]
    with pytest.raises(NotFound):
        await kube.patch_node("n9", {"metadata": {"labels": {"a": "b"}}})


async def test_create_event_is_recorded_for_its_pod(api: FakeApiServer, kube: RestKubeApi) -> None:
    event: Obj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "p.", "namespace": NS},
        "involvedObject": {"kind": "Pod", "namespace": NS, "name": "p", "uid": "u1"},
        "reason": "LeaseReleased",
        "message": "released L1",
        "type": "Normal",
        "source": {"component": "gpushare"},
    }
    await kube.create_event(NS, event)
    (recorded,) = api.events_for("p", NS)
    assert (recorded["reason"], recorded["message"]) == ("LeaseReleased", "released L1")
    with pytest.raises(Conflict) as caught:
        await kube.create_event(NS, {**event, "metadata": recorded["metadata"]})
    assert caught.value.reason == "AlreadyExists"


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error", "reason"),
    [
        (404, NotFound, "NotFound"),
        (409, Conflict, "Conflict"),
        (410, Gone, "Expired"),
        (403, KubeError, "Forbidden"),
        (429, KubeError, "TooManyRequests"),
        (500, KubeError, "InternalError"),
    ],
)
async def test_error_statuses_become_the_ports_errors(
    api: FakeApiServer, kube: RestKubeApi, status: int, error: type[KubeError], reason: str
) -> None:
    api.fail_next("GET", r"^/api/v1/pods", status, message="injected")
    with pytest.raises(KubeError) as caught:
        await kube.list_pods()
    assert type(caught.value) is error
    assert (caught.value.status, caught.value.reason) == (status, reason)
    assert str(caught.value) == f"{status} {reason}: injected"
    assert (await kube.list_pods()).items == []  # the next call is answered again


async def test_a_wrong_token_is_unauthorized(api: FakeApiServer) -> None:
    async with RestKubeApi.from_url(api.url, token="wrong") as kube:
        with pytest.raises(KubeError) as caught:
            await kube.list_pods()
    assert (caught.value.status, caught.value.reason) == (401, "Unauthorized")


async def test_a_broken_connection_and_a_dead_server_are_unreachable(
    api: FakeApiServer, kube: RestKubeApi
) -> None:
    api.create_pod("p", NS)
    await kube.get_pod(NS, "p")  # a connection to reuse
    api.fail_next("GET", r"/pods/p$", 0, times=2)  # aiohttp retries a reused one once
    with pytest.raises(KubeError) as caught:
        await kube.get_pod(NS, "p")
    assert (caught.value.status, caught.value.reason) == (0, "Unreachable")

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    async with RestKubeApi.from_url(f"http://127.0.0.1:{port}", timeout_s=2) as dead:
        with pytest.raises(KubeError) as caught:
            await dead.patch_node("n1", {"metadata": {}})
    assert (caught.value.status, caught.value.reason) == (0, "Unreachable")


async def test_a_netrc_entry_for_the_api_host_changes_nothing(
    api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp's trust_env would read this file on every request, and its basic auth beside
    the bearer token is an error before anything is sent."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    api.create_pod("p", NS)
    async with RestKubeApi.from_url(api.url, token=TOKEN, timeout_s=5.0) as kube:
        assert (await kube.get_pod(NS, "p"))["metadata"]["name"] == "p"


@pytest.mark.parametrize(
    ("environ", "url", "proxy"),
    [
        ({}, "https://10.0.0.1:6443", None),
        ({"https_proxy": "http://proxy:3128"}, "https://10.0.0.1:6443", "http://proxy:3128"),
        ({"HTTPS_PROXY": "http://proxy:3128"}, "http://10.0.0.1:8080", None),
        ({"http_proxy": "http://proxy:3128"}, "http://10.0.0.1:8080", "http://proxy:3128"),
        (
            {"https_proxy": "http://proxy:3128", "no_proxy": "10.0.0.1"},
            "https://10.0.0.1:6443",
            None,
        ),
        (
            {"https_proxy": "http://proxy:3128", "NO_PROXY": ".cluster.local"},
            "https://kubernetes.default.svc.cluster.local",
            None,
        ),
    ],
)
def test_the_proxy_is_the_environments_for_the_api_host(
    environ: dict[str, str], url: str, proxy: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert proxy_from_env(url) == proxy


async def test_requests_go_through_the_environments_proxy(
    api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Looked up once, then used for every request: a proxy that is down makes the API
    unreachable, and NO_PROXY goes around it."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{unused.getsockname()[1]}"
    api.create_pod("p", NS)
    monkeypatch.setenv("http_proxy", dead)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    async with RestKubeApi.from_url(api.url, token=TOKEN, timeout_s=2.0) as kube:
        with pytest.raises(KubeError) as caught:
            await kube.get_pod(NS, "p")
    assert caught.value.reason == "Unreachable"
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    async with RestKubeApi.from_url(api.url, token=TOKEN, timeout_s=2.0) as kube:
        assert (await kube.get_pod(NS, "p"))["metadata"]["name"] == "p"


# -- configuration -------------------------------------------------------------------------


async def test_in_cluster_uses_the_service_account_over_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    token = make_token(tmp_path / "token")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    async with FakeApiServer(token=token, ssl_context=tls) as api:
        api.create_pod("p", NS)
        port = api.url.rsplit(":", 1)[1]
        environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
        async with RestKubeApi.in_cluster(
            token_file=str(tmp_path / "token"), ca_file=str(pki.ca), environ=environ
        ) as kube:
            assert kube.host == api.url
            assert (await kube.get_pod(NS, "p"))["metadata"]["name"] == "p"
        async with RestKubeApi.from_url(api.url, token=token, ca_file=str(pki.ca)) as kube:
            assert len((await kube.list_pods()).items) == 1
        async with RestKubeApi.from_url(api.url, token=token) as kube:  # not our CA
            with pytest.raises(KubeError) as caught:
                await kube.list_pods()
            assert caught.value.reason == "Unreachable"
        async with RestKubeApi.from_url(api.url, token=token, verify=False) as kube:
            assert len((await kube.list_pods()).items) == 1


async def test_in_cluster_reads_a_rotated_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes_asyncio.config import incluster_config

    monkeypatch.setattr(incluster_config, "TOKEN_REFRESH_PERIOD", timedelta(0))  # not 1 min
    pki = make_pki(tmp_path / "pki")
    token_file = tmp_path / "token"
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    async with FakeApiServer(token=make_token(token_file), ssl_context=tls) as api:
        environ = {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": api.url.rsplit(":", 1)[1],
        }
        async with RestKubeApi.in_cluster(
            token_file=str(token_file), ca_file=str(pki.ca), environ=environ
        ) as kube:
            await kube.list_pods()
            api.token = make_token(token_file)  # the kubelet writes a new one
            await kube.list_pods()
            api.token = "not-the-file"
            with pytest.raises(KubeError) as caught:
                await kube.list_pods()
            assert caught.value.status == 401


def test_in_cluster_outside_a_cluster_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not in a cluster"):
        RestKubeApi.in_cluster(token_file=str(tmp_path / "none"), environ={})
