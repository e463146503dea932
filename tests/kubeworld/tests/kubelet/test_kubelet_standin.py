"""The DRA kubelet stand-in against a small fake DRA plugin served here: registration,
version choice, refusals, socket loss, prepare/unprepare, pods and CDI, health."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from agent.dra.proto import registration_pb2 as reg
from tests.helpers import FakeClock, short_dir
from tests.kubeworld.kubelet import DraKubelet, PodStartError, PreparedDevice
from tests.kubeworld.kubelet.fake_plugin import (
    BOTH,
    DRIVER,
    HEALTHY,
    KIND,
    NODE,
    NS,
    UNHEALTHY,
    FakeDraPlugin,
    Obj,
    cdi_device,
    make_claim,
    make_pod,
    write_spec,
)


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture
async def kubelet(root: Path) -> AsyncIterator[DraKubelet]:
    async with DraKubelet(
        root / "registry",
        node_name=NODE,
        cdi_dirs=[root / "etc-cdi", root / "run-cdi"],
        health_retry_s=0.05,
        clock=FakeClock(),
    ) as standin:
        yield standin


@contextlib.asynccontextmanager
async def running(plugin: FakeDraPlugin) -> AsyncIterator[FakeDraPlugin]:
    await plugin.start()
    try:
        yield plugin
    finally:
        await plugin.stop()


@pytest.fixture
async def plugin(root: Path, kubelet: DraKubelet) -> AsyncIterator[FakeDraPlugin]:
    async with running(FakeDraPlugin(root)) as fake:
        await kubelet.wait_registered(DRIVER)
        yield fake


# -- registration --------------------------------------------------------------------------


async def test_registers_a_plugin_and_tells_it(kubelet: DraKubelet, plugin: FakeDraPlugin) -> None:
    info = kubelet.registered[DRIVER]
    assert info.endpoint == str(plugin.dra_socket)
    assert kubelet.service(DRIVER) == "v1.DRAPlugin"  # the first listed it knows
    await kubelet.wait_for(lambda: plugin.statuses)
    assert plugin.statuses == [reg.RegistrationStatus(plugin_registered=True)]
    assert kubelet.registrations == 1
    await kubelet.prepare([make_claim("c", "uid-1")])
    assert plugin.calls == [("v1.DRAPlugin", "NodePrepareResources", ["uid-1"])]


async def test_a_plugin_offering_only_v1beta1_is_called_on_v1beta1(
    root: Path, kubelet: DraKubelet
) -> None:
    async with running(FakeDraPlugin(root, versions=["v1beta1.DRAPlugin"])) as plugin:
        await kubelet.wait_registered(DRIVER)
        assert kubelet.service(DRIVER) == "v1beta1.DRAPlugin"
        results = await kubelet.prepare([make_claim("c", "uid-1")])
        assert await kubelet.unprepare([make_claim("c", "uid-1")]) == {"uid-1": ""}
    assert not isinstance(results["uid-1"], str)
    assert [call[:2] for call in plugin.calls] == [
        ("v1beta1.DRAPlugin", "NodePrepareResources"),
        ("v1beta1.DRAPlugin", "NodeUnprepareResources"),
    ]


@pytest.mark.parametrize(
    ("info", "error"),
    [
        (
            {"plugin_type": "CSIPlugin"},
            "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket ",
        ),
        (
            {"name": ""},
            "RegisterPlugin error -- plugin validation failed with err: DRA driver name is empty",
        ),
        (
            {"versions": ["v2.DRAPlugin", "v1alpha1.DRAResourceHealth"]},
            "none of services supported by the plugin "
            '(["v2.DRAPlugin" "v1alpha1.DRAResourceHealth"]) are supported by the kubelet '
            '(["v1.DRAPlugin" "v1beta1.DRAPlugin"])',
        ),
        ({"versions": []}, "empty list of supported gRPC services (aka supported versions)"),
    ],
    ids=["type", "name", "versions", "no-versions"],
)
async def test_refuses_an_invalid_plugin(
    root: Path, kubelet: DraKubelet, info: Obj, error: str
) -> None:
    async with running(FakeDraPlugin(root, **info)) as plugin:
        await kubelet.wait_for(lambda: plugin.statuses)
    refusal = plugin.statuses[0]
    assert not refusal.plugin_registered
    assert error in refusal.error
    assert kubelet.registration_errors[0] == refusal.error
    assert kubelet.registered == {}
    assert kubelet.registrations == 0


async def test_refuses_a_second_plugin_on_the_same_endpoint(
    root: Path, kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    second = FakeDraPlugin(root, reg_name="other", serve_dra=False)
    async with running(second):
        await kubelet.wait_for(lambda: second.statuses)
    assert second.statuses[0].error == (
        "RegisterPlugin error -- plugin registration failed with err: endpoint "
        f"{plugin.dra_socket} already registered for DRA driver plugin {DRIVER}"
    )
    assert kubelet.registrations == 1


async def test_a_deleted_socket_deregisters_and_a_new_one_registers_again(
    kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    await kubelet.wait_for(lambda: plugin.health_streams)
    await plugin.stop_registration()
    await kubelet.wait_for(lambda: DRIVER not in kubelet.registered)
    await kubelet.wait_for(lambda: not plugin.health_streams)  # its stream was closed
    assert await kubelet.prepare([make_claim("c", "uid-1")]) == {
        "uid-1": f"DRA driver {DRIVER} is not registered"
    }
    await plugin.start_registration()
    await kubelet.wait_registered(DRIVER)
    await kubelet.wait_for(lambda: len(plugin.statuses) == 2)
    assert [s.plugin_registered for s in plugin.statuses] == [True, True]
    assert kubelet.registrations == 2
    await kubelet.wait_for(lambda: plugin.health_streams)  # a new stream


# -- prepare / unprepare -------------------------------------------------------------------


async def test_prepare_and_unprepare_answer_per_claim(
    kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    plugin.devices["uid-1"] = [
        {"request_names": ["gpu"], "device": "gpu-0", "share_id": "s-1"},
        {"request_names": [], "device": "gpu-1", "cdi": []},
    ]
    plugin.prepare_errors["uid-2"] = "no room on gpu-0"
    plugin.unprepare_errors["uid-2"] = "still in use"
    claims = [
        make_claim("one", "uid-1"),
        make_claim("two", "uid-2"),
        make_claim("other", "uid-3", drivers=["other.example.com"]),
        {"metadata": {"name": "pending", "namespace": NS, "uid": "uid-4"}, "status": {}},
    ]
    results = await kubelet.prepare(claims)
    assert results == {
        "uid-1": [
            PreparedDevice(("gpu",), NODE, "gpu-0", (f"{KIND}=uid-1-gpu-0",), "s-1", DRIVER),
            PreparedDevice((), NODE, "gpu-1", (), None, DRIVER),
        ],
        "uid-2": "no room on gpu-0",
        "uid-3": "DRA driver other.example.com is not registered",
        "uid-4": f"ResourceClaim {NS}/pending is not allocated",
    }
    assert plugin.calls == [("v1.DRAPlugin", "NodePrepareResources", ["uid-1", "uid-2"])]
    assert await kubelet.unprepare(claims) == {
        "uid-1": "",
        "uid-2": "still in use",
        "uid-3": "DRA driver other.example.com is not registered",
        "uid-4": "",
    }
    assert plugin.calls[-1] == ("v1.DRAPlugin", "NodeUnprepareResources", ["uid-1", "uid-2"])


async def test_a_failed_call_is_the_error_of_each_of_its_claims(
    root: Path, kubelet: DraKubelet
) -> None:
    async with running(FakeDraPlugin(root, versions=BOTH, serve_dra=False)):
        await kubelet.wait_registered(DRIVER)
        results = await kubelet.prepare([make_claim("a", "uid-1"), make_claim("b", "uid-2")])
    assert results["uid-1"] == results["uid-2"]
    assert str(results["uid-1"]).startswith("NodePrepareResources failed: UNAVAILABLE")


# -- pods and CDI --------------------------------------------------------------------------


async def test_containers_get_the_cdi_edits_of_the_requests_they_reference(
    root: Path, kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    plugin.devices["uid-1"] = [
        {"request_names": ["train"], "device": "gpu-0"},
        {"request_names": ["infer"], "device": "gpu-1"},
    ]
    node = {"path": "/dev/nvidia0", "permissions": "rw"}
    mount = {"hostPath": "/run/mps/0", "containerPath": "/tmp/mps", "options": ["rbind", "rw"]}
    write_spec(
        root / "run-cdi",
        "gpushare.io-claim_uid-1.json",
        [
            cdi_device("uid-1-gpu-0", "VISIBLE=0", "LIMIT=1", deviceNodes=[node], mounts=[mount]),
            cdi_device("uid-1-gpu-1", "VISIBLE=1", "LIMIT=2"),
        ],
        containerEdits={"env": ["SPEC_LEVEL=yes", "LIMIT=0"]},
    )
    pod = make_pod(
        "p1",
        {"gpus": {"resourceClaimName": "gpus"}},
        {
            "both": [{"name": "gpus"}],
            "train": [{"name": "gpus", "request": "train"}],
            "none": [],
        },
    )
    containers = await kubelet.run_pod(
        pod, {"gpus": make_claim("gpus", "uid-1", reserved_for=["p1"])}
    )
    both, train, none = containers["both"], containers["train"], containers["none"]
    assert both.cdi_ids == [f"{KIND}=uid-1-gpu-0", f"{KIND}=uid-1-gpu-1"]
    # spec-level edits once, then each device's; a later key wins
    assert both.env == {"FROM_POD": "1", "SPEC_LEVEL": "yes", "LIMIT": "2", "VISIBLE": "1"}
    assert train.env == {"FROM_POD": "1", "SPEC_LEVEL": "yes", "LIMIT": "1", "VISIBLE": "0"}
    assert train.device_nodes == [{**node, "hostPath": "/dev/nvidia0"}]
    assert train.mounts == [mount]
    assert none.cdi_ids == [] and none.env == {"FROM_POD": "1"}
    assert not any(c.error for c in containers.values())


async def test_a_later_cdi_directory_wins(
    root: Path, kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    write_spec(root / "etc-cdi", "a.yaml", [cdi_device("uid-1-gpu-0", "FROM=etc")])
    write_spec(root / "run-cdi", "b.json", [cdi_device("uid-1-gpu-0", "FROM=run")])
    write_spec(root / "run-cdi" / "nested", "c.json", [cdi_device("uid-1-gpu-0", "FROM=nested")])
    (root / "run-cdi" / "d.txt").write_text("not a spec")
    pod = make_pod("p1", {"g": {"resourceClaimName": "g"}}, {"main": [{"name": "g"}]})
    containers = await kubelet.run_pod(pod, {"g": make_claim("g", "uid-1", reserved_for=["p1"])})
    assert containers["main"].env["FROM"] == "run"


async def test_an_unresolvable_cdi_id_fails_the_container(
    root: Path, kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    # a spec whose cdiVersion is too old for a device name starting with a digit is ignored
    write_spec(root / "run-cdi", "old.json", [cdi_device("1-gpu-0", "A=1")], cdiVersion="0.3.0")
    plugin.devices["1"] = [{"request_names": [], "device": "gpu-0"}]
    pod = make_pod(
        "p1",
        {"g": {"resourceClaimName": "g"}},
        {"main": [{"name": "g"}], "sidecar": []},
    )
    containers = await kubelet.run_pod(pod, {"g": make_claim("g", "1", reserved_for=["p1"])})
    assert containers["main"].error == (
        f"CDI device injection failed: unresolvable CDI devices {KIND}=1-gpu-0"
    )
    assert containers["sidecar"].error == ""
    [why] = kubelet.cdi_errors.values()
    assert "cdiVersion 0.3.0 is below 0.5.0" in why


async def test_a_failed_claim_fails_the_pod_and_stopping_it_unprepares(
    kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    plugin.prepare_errors["uid-1"] = "device gone"
    pod = make_pod("p1", {"g": {"resourceClaimName": "g"}}, {"main": [{"name": "g"}]})
    claim = make_claim("g", "uid-1", reserved_for=["p1"])
    with pytest.raises(
        PodStartError, match=f"NodePrepareResources failed for claim {NS}/g: device gone"
    ):
        await kubelet.run_pod(pod, {"g": claim})
    del plugin.prepare_errors["uid-1"]
    containers = await kubelet.run_pod(pod, {"g": claim})  # the pod worker's next sync
    assert containers["main"].cdi_ids == [f"{KIND}=uid-1-gpu-0"]
    assert await kubelet.stop_pod(pod) == {"uid-1": ""}
    assert [c[1] for c in plugin.calls] == ["NodePrepareResources"] * 2 + ["NodeUnprepareResources"]


async def test_a_shared_claim_is_prepared_once_and_unprepared_after_its_last_pod(
    kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    claim = make_claim("shared", "uid-1", reserved_for=["p1", "p2"])
    pods = [
        make_pod(uid, {"g": {"resourceClaimName": "shared"}}, {"main": [{"name": "g"}]})
        for uid in ("p1", "p2")
    ]
    for pod in pods:
        await kubelet.run_pod(pod, {"shared": claim})
    assert kubelet.claim_pods == {"uid-1": {"p1", "p2"}}
    assert await kubelet.stop_pod(pods[0]) == {}
    assert await kubelet.stop_pod(pods[1]) == {"uid-1": ""}
    assert [c[1] for c in plugin.calls] == ["NodePrepareResources", "NodeUnprepareResources"]


async def test_a_claim_not_reserved_for_the_pod_is_refused(
    kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    pod = make_pod("p1", {"g": {"resourceClaimName": "g"}}, {"main": [{"name": "g"}]})
    claim = make_claim("g", "uid-1", reserved_for=["someone-else"])
    with pytest.raises(PodStartError, match="pod pod-p1\\(p1\\) is not allowed to use resource"):
        await kubelet.run_pod(pod, {"g": claim})
    assert plugin.calls == []


@contextlib.asynccontextmanager
async def claims_api(claims: list[Obj], token: str) -> AsyncIterator[str]:
    """A server answering GET .../resourceclaims/<name> (401 without the token)."""

    async def get_claim(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {token}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        for claim in claims:
            meta = claim["metadata"]
            if (meta["namespace"], meta["name"]) == (
                request.match_info["ns"],
                request.match_info["name"],
            ):
                return web.json_response(claim)
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}", get_claim)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_claims_are_read_from_the_api_server(root: Path) -> None:
    claims = [make_claim("p1-gpus-x7k2q", "uid-1", reserved_for=["p1"])]
    pod = make_pod(
        "p1",
        {
            "gpus": {"resourceClaimTemplateName": "gpus"},
            "unused": {"resourceClaimTemplateName": "t"},
        },
        {"main": [{"name": "gpus"}]},
    )
    pod["status"] = {
        "resourceClaimStatuses": [
            {"name": "gpus", "resourceClaimName": "p1-gpus-x7k2q"},
            {"name": "unused"},  # no claim needed
        ]
    }
    async with (
        claims_api(claims, "t0ken") as url,
        DraKubelet(
            root / "registry", node_name=NODE, api_url=url, token="t0ken", cdi_dirs=[]
        ) as kubelet,
        running(FakeDraPlugin(root)) as plugin,
    ):
        await kubelet.wait_registered(DRIVER)
        containers = await kubelet.run_pod(pod)
        missing = make_pod("p2", {"g": {"resourceClaimName": "gone"}}, {"main": []})
        with pytest.raises(PodStartError, match="HTTP 404"):
            await kubelet.run_pod(missing)
        pod["status"]["resourceClaimStatuses"] = []
        with pytest.raises(PodStartError, match="has not been created yet"):
            await kubelet.run_pod(pod)
    assert plugin.calls[0] == ("v1.DRAPlugin", "NodePrepareResources", ["uid-1"])
    assert containers["main"].cdi_ids == [f"{KIND}=uid-1-gpu-0"]


# -- health --------------------------------------------------------------------------------


async def test_health_keeps_the_latest_full_list(
    kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    await kubelet.wait_for(lambda: plugin.health_streams)
    plugin.send_health(
        [
            {"device": "gpu-0", "health": HEALTHY},
            {"device": "gpu-1", "health": UNHEALTHY, "message": "Xid 79"},
        ]
    )
    await kubelet.wait_for(lambda: len(kubelet.health(DRIVER)) == 2)
    assert kubelet.health(DRIVER) == {
        (NODE, "gpu-0"): ("Healthy", ""),
        (NODE, "gpu-1"): ("Unhealthy", "Xid 79"),
    }
    assert kubelet.health_service(DRIVER) == "v1.DRAResourceHealth"
    plugin.send_health([{"device": "gpu-1", "health": HEALTHY}])  # gpu-0 left out
    await kubelet.wait_for(lambda: kubelet.health(DRIVER)[(NODE, "gpu-0")][0] == "Unknown")
    assert kubelet.health(DRIVER)[(NODE, "gpu-1")] == ("Healthy", "")


async def test_health_turns_unknown_after_its_timeout(
    kubelet: DraKubelet, plugin: FakeDraPlugin
) -> None:
    await kubelet.wait_for(lambda: plugin.health_streams)
    plugin.send_health(
        [
            {"device": "gpu-0", "health": HEALTHY},
            {"device": "gpu-1", "health": HEALTHY, "timeout_s": 60},
        ]
    )
    await kubelet.wait_for(lambda: len(kubelet.health(DRIVER)) == 2)
    clock = kubelet.clock
    assert isinstance(clock, FakeClock)
    clock.advance(31)
    assert {k: v[0] for k, v in kubelet.health(DRIVER).items()} == {
        (NODE, "gpu-0"): "Unknown",  # the default 30 s
        (NODE, "gpu-1"): "Healthy",
    }
    clock.advance(30)
    assert kubelet.health(DRIVER)[(NODE, "gpu-1")][0] == "Unknown"


async def test_health_falls_back_to_v1alpha1_and_reopens_a_lost_stream(
    root: Path, kubelet: DraKubelet
) -> None:
    async with running(FakeDraPlugin(root, health=["v1alpha1"])) as plugin:
        await kubelet.wait_for(lambda: plugin.health_streams)
        plugin.send_health([{"device": "gpu-0", "health": UNHEALTHY, "message": "fell off"}])
        await kubelet.wait_for(lambda: kubelet.health(DRIVER))
        assert kubelet.health_service(DRIVER) == "v1alpha1.DRAResourceHealth"
        plugin.end_health_streams()
        await kubelet.wait_for(lambda: plugin.health_opened == 2 and plugin.health_streams)
        plugin.send_health([{"device": "gpu-0", "health": HEALTHY}])
        await kubelet.wait_for(lambda: kubelet.health(DRIVER)[(NODE, "gpu-0")][0] == "Healthy")
