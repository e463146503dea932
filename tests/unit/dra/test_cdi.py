"""CDI specs: one file per claim, written whole, named by the claim's UID."""

from __future__ import annotations

import json
from pathlib import Path

from agent.dra.cdi import (
    CdiDevice,
    CdiDeviceNode,
    CdiEdits,
    CdiHook,
    CdiMount,
    cdi_id,
    claim_spec,
    remove_spec,
    spec_claims,
    spec_path,
    write_spec,
)

UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"


def test_a_spec_per_claim_with_each_shares_edits() -> None:
    spec = claim_spec(
        UID,
        [
            CdiDevice(
                "s1",
                {"B": "2", "A": "1"},
                [CdiMount("/run/mps/pipe", "/run/mps/pipe"), CdiMount("/h", "/c", read_only=True)],
                [CdiDeviceNode("/dev/nvidia0"), CdiDeviceNode("/dev/x", host_path="/dev/y")],
            ),
            CdiDevice("s2", {"A": "3"}),
        ],
    )
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "gpushare.io/claim"
    first, second = spec["devices"]
    assert first["name"] == f"{UID}-s1"
    assert first["containerEdits"]["env"] == ["A=1", "B=2"]
    assert first["containerEdits"]["mounts"][1]["options"] == ["rbind", "ro", "nosuid", "nodev"]
    assert first["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "permissions": "rw"},
        {"path": "/dev/x", "hostPath": "/dev/y", "permissions": "rw"},
    ]
    assert second["containerEdits"] == {"env": ["A=3"]}
    assert cdi_id(UID, "s1") == f"gpushare.io/claim={UID}-s1"


def test_written_whole_found_and_removed(tmp_path: Path) -> None:
    spec = claim_spec(UID, [CdiDevice("s1", {"A": "1"})])
    path = write_spec(tmp_path, UID, spec)
    assert path == spec_path(tmp_path, UID) and path.name == f"gpushare.io-claim_{UID}.json"
    assert json.loads(path.read_text()) == spec
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
    (tmp_path / "other-vendor_x.json").write_text("{}")
    assert spec_claims(tmp_path) == {UID}
    assert remove_spec(tmp_path, UID) is True
    assert remove_spec(tmp_path, UID) is False  # twice: still fine
    assert spec_claims(tmp_path / "missing") == set()


def test_every_mount_is_nosuid_nodev_and_dev_shm_noexec() -> None:
    """A directory two claims' containers both get must not carry a setuid binary or a
    device node from one into the other; /dev/shm runs nothing."""
    spec = claim_spec(
        UID,
        [
            CdiDevice(
                "s1",
                {"A": "1"},
                [
                    CdiMount("/run/mps/pipe", "/tmp/nvidia-mps"),
                    CdiMount("/run/shm/t1", "/dev/shm"),
                    CdiMount("/run/shm/t1", "/dev/shm/", read_only=True),
                    # options as given, the weakening ones dropped
                    CdiMount("/h/lib.so", "/lib/lib.so", True, ("ro", "suid", "dev", "rbind")),
                    CdiMount("/h/x", "/dev/shm", options=("rbind", "rw", "exec")),
                ],
            )
        ],
    )
    mounts = spec["devices"][0]["containerEdits"]["mounts"]
    assert [m["options"] for m in mounts] == [
        ["rbind", "rw", "nosuid", "nodev"],
        ["rbind", "rw", "nosuid", "nodev", "noexec"],
        ["rbind", "ro", "nosuid", "nodev", "noexec"],
        ["ro", "rbind", "nosuid", "nodev"],
        ["rbind", "rw", "nosuid", "nodev", "noexec"],
    ]


def test_edits_every_device_shares_are_written_once_at_the_spec_level() -> None:
    hook = CdiHook(
        "createContainer",
        "/usr/bin/nvidia-cdi-hook",
        ("nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"),
        ("NVIDIA_CTK_DEBUG=false",),
    )
    library = CdiMount(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.570.1",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.570.1",
        True,
        ("ro", "nosuid", "nodev", "rbind", "rprivate"),
    )
    common = CdiEdits(
        ("NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu",), (library,), (), (hook,)
    )
    spec = claim_spec(
        UID,
        [CdiDevice("s1", {"A": "1"}, common=common), CdiDevice("s2", {"A": "2"}, common=common)],
    )
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu"],
        "mounts": [
            {
                "hostPath": library.host_path,
                "containerPath": library.container_path,
                "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
            }
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": "/usr/bin/nvidia-cdi-hook",
                "args": list(hook.args),
                "env": ["NVIDIA_CTK_DEBUG=false"],
            }
        ],
    }
    assert [d["containerEdits"] for d in spec["devices"]] == [{"env": ["A=1"]}, {"env": ["A=2"]}]
    assert "containerEdits" not in claim_spec(UID, [CdiDevice("s1", {"A": "1"})])
