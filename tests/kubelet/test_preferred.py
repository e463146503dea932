"""The preferred allocation: deterministic, lowest-numbered first."""

from __future__ import annotations

from agent.legacy.deviceplugin.kubelet.service import natural_key, preferred


def test_ids_sort_by_their_numbers() -> None:
    ids = ["share-10", "share-2", "share-1", "gpu1-share-0", "share-02"]
    assert sorted(ids, key=natural_key) == [
        "gpu1-share-0",
        "share-1",
        "share-02",
        "share-2",
        "share-10",
    ]


def test_preferred_fills_after_must_include() -> None:
    assert preferred(["s-3", "s-1", "s-2"], ["s-3"], 2) == ["s-3", "s-1"]


def test_preferred_is_short_when_too_few_are_available() -> None:
    assert preferred(["s-1"], [], 3) == ["s-1"]


def test_preferred_does_not_repeat_ids() -> None:
    assert preferred(["s-2", "s-1", "s-1"], ["s-2", "s-2"], 3) == ["s-2", "s-1"]


def test_preferred_of_nothing_is_nothing() -> None:
    assert preferred(["s-1"], [], 0) == []
