"""The node's claim index: a claim's name kept durably by its UID, one file each."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.claims.index import ClaimIndex, ClaimName

UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000002"


def test_a_name_is_kept_read_back_by_another_process_and_forgotten(tmp_path: Path) -> None:
    index = ClaimIndex(tmp_path / "claims")
    assert index.uids() == set() and index.get(UID) is None  # no directory yet
    assert index.remember(UID, "ns", "a-gpu-x")
    assert not index.remember(UID, "ns", "a-gpu-x")  # known: no second write
    again = ClaimIndex(tmp_path / "claims")  # as after a restart
    found = again.get(UID)
    assert isinstance(found, ClaimName) and (found.namespace, found.name) == ("ns", "a-gpu-x")
    assert found.at > 0
    assert again.uids() == {UID}
    assert [p.name for p in (tmp_path / "claims").iterdir()] == [f"{UID}.json"]  # no temp
    assert again.forget(UID) and not again.forget(UID)
    assert again.uids() == set()


def test_a_name_written_anew_replaces_the_old(tmp_path: Path) -> None:
    index = ClaimIndex(tmp_path)
    index.remember(UID, "ns", "a")
    index.remember(UID, "ns", "b")
    assert ClaimIndex(tmp_path).get(UID) == ClaimName("ns", "b", index.get(UID).at)  # type: ignore[union-attr]


@pytest.mark.parametrize("uid", ["../etc/passwd", "", ".hidden", "a/b", "x" * 200])
def test_a_uid_that_is_no_file_name_is_refused(tmp_path: Path, uid: str) -> None:
    with pytest.raises(ValueError):
        ClaimIndex(tmp_path).remember(uid, "ns", "a")
    assert not ClaimIndex(tmp_path).forget(uid)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["{", "[]", '{"version": 1}', '{"version": 2, "claimUID": "u"}'])
def test_an_entry_that_cannot_be_read_is_none_but_listed(tmp_path: Path, text: str) -> None:
    (tmp_path / f"{UID}.json").write_text(text)
    index = ClaimIndex(tmp_path)
    assert index.get(UID) is None
    assert index.entries() == {UID: None}
