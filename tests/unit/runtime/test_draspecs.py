"""The claims' CDI specs kept in the state directory and written again at start (a reboot
empties /var/run, and the kubelet does not prepare its claims again)."""

from __future__ import annotations

import json
from pathlib import Path

from agent.dra.cdi import spec_path, write_spec
from agent.runtime.draspecs import KeptSpec, SpecKeeper


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
