"""The NVIDIA container toolkit's driver libraries and hooks in every claim's CDI spec,
where the node has nvidia-ctk (here a stand-in printing a spec in NVIDIA's shape), and
what the agent says where it has not: the specs go without, the doctor warns."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent.claims.container import DriverPaths, admin_device, share_device
from agent.core.types import AdmissionRequest, PriorityClass
from agent.core.units import GIB
from agent.dra import toolkit
from agent.dra.cdi import CdiHook, CdiMount, claim_spec
from agent.dra.toolkit import common_edits, doctor_check
from tests.dra.toolkit_standin import DRIVER, LIB_DIR, make_standin, rooted_spec
from tests.helpers import fake_ports, running_app, sim_settings

UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000003"


async def test_the_toolkits_libraries_and_hooks_go_once_into_every_claims_spec(
    root: Path,
) -> None:
    standin = make_standin(root / "toolkit")
    found = await toolkit.load(str(standin.nvidia_ctk))
    assert standin.ctk_calls.read_text().split() == ["cdi", "generate", "--format=json"]
    edits = found.edits
    assert edits is not None and found.why == "" and found.program == str(standin.nvidia_ctk)
    # NVIDIA_VISIBLE_DEVICES is the share's own; device nodes are the agent's own, checked
    # at each Prepare (the toolkit's, seen once at start, are not taken)
    assert edits.env == (f"NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}",)
    assert edits.device_nodes == ()
    assert [h.args[1] for h in edits.hooks] == [
        "create-symlinks",
        "enable-cuda-compat",
        "update-ldcache",
        "disable-device-node-modification",
    ]
    assert all(
        h.path == str(standin.hook) and h.hook_name == "createContainer" for h in edits.hooks
    )
    assert edits.mounts == (
        CdiMount(
            str(standin.library),
            f"{LIB_DIR}/libcuda.so.{DRIVER}",
            True,
            ("ro", "nosuid", "nodev", "rbind", "rprivate"),
        ),
    )

    paths = DriverPaths(cdi_dir=str(root / "cdi"), dev_root=str(root / "dev"), common=edits)
    async with running_app(
        sim_settings(root, **{"estimator.model_dir": "none"}), fake_ports()
    ) as app:
        assert app.node is not None
        leases = []
        for i, device in enumerate(app.devices):
            request = AdmissionRequest(
                f"r{i}", "t", "t", PriorityClass.BURSTABLE, 4 * GIB, 25, device_uuid=device.uuid
            )
            lease = (await app.node.admit(request)).lease
            assert lease is not None
            leases.append(lease)
        shares = [share_device(app.node, paths, f"s{i}", x) for i, x in enumerate(leases)]
        admin = admin_device("a0", app.devices[0], paths)
    spec = claim_spec(UID, [*shares, admin])
    top = spec["containerEdits"]
    assert [h["args"][1] for h in top["hooks"]] == [h.args[1] for h in edits.hooks]
    assert len(top["hooks"]) == 4, "once, for the claim's three devices"
    assert top["mounts"] == [
        {
            "hostPath": str(standin.library),
            "containerPath": f"{LIB_DIR}/libcuda.so.{DRIVER}",
            "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
        }
    ]
    assert top["env"] == [f"NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}"]
    for device, lease in zip(spec["devices"], leases, strict=False):
        env = device["containerEdits"]["env"]
        assert f"NVIDIA_VISIBLE_DEVICES={lease.device_uuid}" in env
        assert "hooks" not in device["containerEdits"]


async def test_without_the_toolkit_the_specs_go_without_it_and_the_doctor_says_so(
    root: Path,
) -> None:
    missing = await toolkit.load(str(root / "nowhere" / "nvidia-ctk"))
    assert missing.edits is None and missing.program == "" and "not found" in missing.why
    assert (await toolkit.load("")).why == "no nvidia-ctk configured"
    paths = DriverPaths(cdi_dir=str(root / "cdi"), common=missing.edits)
    async with running_app(
        sim_settings(root, **{"estimator.model_dir": "none"}), fake_ports()
    ) as app:
        assert app.node is not None
        device = app.devices[0]
        request = AdmissionRequest(
            "r", "t", "t", PriorityClass.BURSTABLE, 4 * GIB, 25, device_uuid=device.uuid
        )
        lease = (await app.node.admit(request)).lease
        assert lease is not None
        share = share_device(app.node, paths, "s0", lease)
    spec = claim_spec(UID, [share])
    assert "containerEdits" not in spec
    assert (
        spec["devices"][0]["containerEdits"]["env"].count(f"NVIDIA_VISIBLE_DEVICES={device.uuid}")
        == 1
    )

    status, found, fix = doctor_check("nvidia-ctk", enabled=True, which=lambda _: None)
    assert status == "warn" and "runtimeClassName: nvidia" in found and fix
    standin = make_standin(root / "toolkit")
    status, found, _ = doctor_check(str(standin.nvidia_ctk), enabled=True)
    assert status == "ok" and found.startswith(str(standin.nvidia_ctk))
    assert doctor_check("nvidia-ctk", enabled=False)[0] == "skip"
    assert doctor_check("nvidia-ctk", enabled=True, simulated=True)[0] == "skip"


async def test_a_toolkit_that_fails_or_hangs_leaves_the_specs_without_it(root: Path) -> None:
    failing = make_standin(root / "failing", exit_code=1)
    said = await toolkit.load(str(failing.nvidia_ctk))
    assert said.edits is None and said.program == str(failing.nvidia_ctk)
    assert "exited 1" in said.why and "ERROR_LIBRARY_NOT_FOUND" in said.why

    hanging = make_standin(root / "hanging", sleep_s=30)
    started = time.monotonic()
    said = await toolkit.load(str(hanging.nvidia_ctk), timeout_s=0.5)
    assert time.monotonic() - started < 10, "killed at its timeout"
    assert said.edits is None and "took more than 0.5 s" in said.why


BAD_OUTPUTS = [
    ("not json", "is not JSON"),
    ("", "printed no spec"),
    (
        json.dumps({"cdiVersion": "0.5.0", "kind": "other.com/x", "devices": []}),
        "no nvidia.com/gpu",
    ),
    (
        json.dumps({"kind": "nvidia.com/gpu", "containerEdits": {"env": ["NO_EQUALS"]}}),
        "not KEY=VALUE",
    ),
    (
        json.dumps(
            {
                "kind": "nvidia.com/gpu",
                "containerEdits": {"hooks": [{"hookName": "x", "path": "/h"}]},
            }
        ),
        "no known hookName",
    ),
    (
        json.dumps({"kind": "nvidia.com/gpu", "containerEdits": {"mounts": [{"hostPath": "/h"}]}}),
        "lacks hostPath or containerPath",
    ),
]


@pytest.mark.parametrize(("output", "said"), BAD_OUTPUTS)
async def test_output_that_is_not_a_usable_spec_is_refused_whole(
    root: Path, output: str, said: str
) -> None:
    """A spec a runtime would refuse would fail every claim's pod: better none of it."""
    standin = make_standin(root / "bad", output=output)
    found = await toolkit.load(str(standin.nvidia_ctk))
    assert found.edits is None and said in found.why


async def test_where_the_agent_sees_the_host_under_a_root_the_spec_names_host_paths(
    root: Path,
) -> None:
    """The agent's pod mounts the host's / at a root: nvidia-ctk is told so, and the
    paths it prints under that root are the host's own in the claims' specs."""
    standin = make_standin(root / "toolkit")
    host_root = root / "host"
    rooted_spec(standin, host_root)
    found = await toolkit.load(str(standin.nvidia_ctk), host_root=f"{host_root}/")
    assert standin.ctk_calls.read_text().split() == [
        "cdi",
        "generate",
        "--format=json",
        f"--driver-root={host_root}",
    ]
    assert found.edits is not None
    assert {h.path for h in found.edits.hooks} == {str(standin.hook)}
    assert [m.host_path for m in found.edits.mounts] == [str(standin.library)]


def test_several_specs_in_one_output_give_the_gpu_kinds_edits_each_once() -> None:
    gpu = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [],
        "containerEdits": {
            "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook"}],
            "env": ["A=1"],
        },
    }
    imex = {"cdiVersion": "0.5.0", "kind": "nvidia.com/imex-channel", "devices": []}
    edits = common_edits(json.dumps(gpu) + "\n" + json.dumps(imex) + json.dumps(gpu))
    assert edits.hooks == (CdiHook("createContainer", "/usr/bin/nvidia-cdi-hook"),)
    assert edits.env == ("A=1",)
