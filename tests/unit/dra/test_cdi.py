"""CDI specs: one file per claim, written whole, named by the claim's UID."""

from __future__ import annotations

import json
from pathlib import Path

from agent.dra.cdi import (
    CdiDevice,
    CdiDeviceNode,
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
    assert first["containerEdits"]["mounts"][1]["options"] == ["rbind", "ro"]
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
