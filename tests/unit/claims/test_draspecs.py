"""The claims' CDI specs kept in the state directory and written again at start (a reboot
empties /var/run, and the kubelet does not prepare its claims again)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.claims.specs import KeptSpec, SpecKeeper
from agent.dra.cdi import spec_path, write_spec


def spec(uid: str, lease_id: str = "") -> dict[str, object]:
    env = [f"GPUSHARE_LEASE_ID={lease_id}"] if lease_id else ["NVIDIA_VISIBLE_DEVICES=GPU-1"]
    return {
        "cdiVersion": "0.5.0",
        "kind": "gpushare.io/claim",
        "devices": [{"name": f"{uid}-s", "containerEdits": {"env": env}}],
    }


def on_disk(keeper: SpecKeeper, uid: str) -> object:
    return json.loads(spec_path(keeper.cdi_dir, uid).read_text())


def test_a_reboot_loses_the_cdi_directory_and_start_writes_back_what_is_still_prepared(
    tmp_path: Path,
) -> None:
    keeper = SpecKeeper(tmp_path / "run" / "cdi", tmp_path / "state" / "cdi")
    keeper.write(KeptSpec("live", ("l1",), spec("live", "l1")))
    keeper.write(KeptSpec("ended", ("l2",), spec("ended", "l2")))
    keeper.write(KeptSpec("admin", (), spec("admin")))
    keeper.write(KeptSpec("gone", ("l3",), spec("gone", "l3")))
    keeper.remove("gone")  # unprepared before the reboot
    for path in (tmp_path / "run" / "cdi").iterdir():
        path.unlink()  # the reboot
    live = {"live": ["l1"]}
    done = keeper.restore(lambda uid: live.get(uid, []))
    assert sorted(done.written) == ["admin", "live"]
    assert done.dropped == ["ended"]  # its lease ended: nothing to write, record gone
    assert on_disk(keeper, "live") == spec("live", "l1")
    assert on_disk(keeper, "admin") == spec("admin")
    assert keeper.claims() == {"live", "admin"}
    again = keeper.restore(lambda uid: live.get(uid, []))
    assert again.written == [] and again.dropped == []  # nothing to do twice


def test_a_spec_changed_on_disk_is_written_back_as_kept(tmp_path: Path) -> None:
    keeper = SpecKeeper(tmp_path / "cdi", tmp_path / "kept")
    keeper.write(KeptSpec("c", ("l1",), spec("c", "l1")))
    spec_path(keeper.cdi_dir, "c").write_text("{half")
    assert keeper.restore(lambda _uid: ["l1"]).written == ["c"]
    assert on_disk(keeper, "c") == spec("c", "l1")


def test_specs_of_the_previous_release_are_recorded_when_their_claim_is_live(
    tmp_path: Path,
) -> None:
    keeper = SpecKeeper(tmp_path / "cdi", tmp_path / "kept")
    write_spec(keeper.cdi_dir, "old", spec("old", "l1"))  # written before records existed
    write_spec(keeper.cdi_dir, "orphan", spec("orphan", "l9"))
    done = keeper.restore(lambda uid: ["l1"] if uid == "old" else [])
    assert done.adopted == ["old"]
    assert keeper.kept("old") is not None and keeper.kept("orphan") is None
    assert spec_path(keeper.cdi_dir, "orphan").exists()  # the reconcile's to decide


def test_an_unreadable_record_is_left_alone(tmp_path: Path) -> None:
    keeper = SpecKeeper(tmp_path / "cdi", tmp_path / "kept")
    keeper.write(KeptSpec("c", ("l1",), spec("c", "l1")))
    spec_path(keeper.keep_dir, "c").write_text("not json")
    done = keeper.restore(lambda _uid: [])
    assert done.unreadable == ["c"] and done.dropped == []
    assert spec_path(keeper.cdi_dir, "c").exists()


def test_start_writes_the_spec_as_the_agent_builds_it_now(tmp_path: Path) -> None:
    """A spec kept (or left by the last release) in an older layout is written again as
    the agent builds it today, and its record follows."""
    keeper = SpecKeeper(tmp_path / "cdi", tmp_path / "kept")
    keeper.write(KeptSpec("c", ("l1",), spec("c", "l1")))
    write_spec(keeper.cdi_dir, "old", spec("old", "l2"))
    now = {"c": spec("c", "l1-new"), "old": spec("old", "l2-new")}
    done = keeper.restore(lambda uid: {"c": ["l1"], "old": ["l2"]}[uid], lambda k: now[k.claim_uid])
    assert done.written == ["c"] and done.adopted == ["old"]
    assert on_disk(keeper, "c") == now["c"] and on_disk(keeper, "old") == now["old"]
    assert (kept := keeper.kept("c")) is not None and kept.spec == now["c"]


def test_a_power_cut_that_loses_a_leased_claims_record_rebuilds_it_from_the_ledger(
    tmp_path: Path,
) -> None:
    """Records of claims with leases are not synced to the disk: one a power cut lost (or
    tore) is built again from the claim's live leases, which the ledger keeps synced."""
    keeper = SpecKeeper(tmp_path / "cdi", tmp_path / "kept")
    keeper.write(KeptSpec("lost", ("l1",), spec("lost", "l1")))
    keeper.write(KeptSpec("torn", ("l2",), spec("torn", "l2")))
    for uid in ("lost", "torn"):
        spec_path(keeper.cdi_dir, uid).unlink()  # /var/run emptied
    spec_path(keeper.keep_dir, "lost").unlink()  # the rename never reached the disk
    spec_path(keeper.keep_dir, "torn").write_text("")  # nor the data
    live = {"lost": ["l1"], "torn": ["l2"], "no-spec": ["l3"]}
    built = {"lost": spec("lost", "l1"), "torn": spec("torn", "l2")}
    done = keeper.restore(
        lambda uid: live.get(uid, []),
        lambda kept: built.get(kept.claim_uid),
        leased=["lost", "torn", "no-spec", "ended"],
    )
    assert sorted(done.rebuilt) == ["lost", "torn"] and done.unreadable == []
    assert on_disk(keeper, "lost") == built["lost"] and on_disk(keeper, "torn") == built["torn"]
    assert (kept := keeper.kept("torn")) is not None and kept.lease_ids == ("l2",)
    assert keeper.claims() == {"lost", "torn"}  # nothing to build for the others
    assert keeper.restore(lambda uid: live.get(uid, []), leased=live).rebuilt == []


def test_only_a_record_with_admin_access_devices_is_synced_to_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adminAccess devices have no lease to rebuild them from after a power cut."""
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    keeper = SpecKeeper(tmp_path / "cdi", tmp_path / "kept")
    keeper.write(KeptSpec("share", ("l1",), spec("share", "l1")))
    assert synced == []
    keeper.write(KeptSpec("admin", (), spec("admin"), (("r-gpu-0", "GPU-1"),)))
    assert len(synced) == 2  # the record and its directory; the CDI file is rebuilt
