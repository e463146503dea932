"""The extender's names (``nodenames``, ``nodes.items``, the binding arguments): Kubernetes'
rules (:mod:`agent.core.k8snames`), a refusal saying which argument and why."""

from __future__ import annotations

from typing import Any, cast

import pytest

from agent.admission.policy import Rules
from agent.legacy.cluster.extender import Extender, MalformedArgs

UID = "7d1c4c1e-0b8a-4c1e-9a51-3f0f5b3c9e11"


class RecordingBinder:
    def __init__(self) -> None:
        self.bound: list[tuple[str, str, str, str]] = []

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        self.bound.append((namespace, name, uid, node))
        return ""


def extender() -> tuple[Extender, RecordingBinder]:
    binder = RecordingBinder()
    return Extender(cast(Any, None), cast(Any, binder), Rules()), binder


def binding(**fields: object) -> dict[str, object]:
    return {"PodName": "train-0", "PodNamespace": "team-a", "PodUID": UID, "Node": "n1", **fields}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"PodUID": "u-1"},  # not a UUID: kept, as the extender always kept it
        {"Node": "gpu-node-1.zone-a.example", "PodName": "p" * 253},
        {"podnamespace": "team-b", "PodNamespace": None},  # any case of the Go field name
    ],
)
async def test_good_binding_arguments_reach_the_binder(fields: dict[str, object]) -> None:
    made, binder = extender()
    args = {k: v for k, v in binding(**fields).items() if v is not None}
    assert await made.bind(args) == {"Error": ""}
    assert len(binder.bound) == 1


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"PodNamespace": "Team-A"}, "PodNamespace is not a Kubernetes name: it holds U+0054"),
        ({"PodNamespace": "n" * 64}, "PodNamespace is not a Kubernetes name: it is longer than 63"),
        ({"PodName": "train-0."}, "PodName is not a Kubernetes name: it is not a DNS-1123"),
        ({"PodUID": "a:b"}, "PodUID is not a Kubernetes name: it holds U+003A (COLON)"),
        ({"PodUID": "../x"}, "PodUID is not a Kubernetes name: it holds U+002F (SOLIDUS)"),
        ({"PodUID": "-u"}, "PodUID is not a Kubernetes name: it is not a UID"),
        ({"PodUID": ""}, "PodUID is not a Kubernetes name: it is empty"),
        ({"Node": "n1\nforged"}, "Node is not a Kubernetes name: it holds U+000A"),
        ({"Node": 7}, "Node must be a string"),
    ],
)
async def test_bad_binding_arguments_are_refused(fields: dict[str, object], why: str) -> None:
    made, binder = extender()
    with pytest.raises(MalformedArgs) as info:
        await made.bind(binding(**fields))
    assert str(info.value).startswith(why) and str(info.value).isprintable()
    assert binder.bound == []


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"nodenames": ["n1", "N2"]}, "nodenames[1] is not a Kubernetes name: it holds U+004E"),
        ({"nodenames": ["n" * 254]}, "nodenames[0] is not a Kubernetes name: it is longer"),
        (
            {"nodes": {"items": [{"metadata": {"name": "a..b"}}]}},
            "nodes.items[0].metadata.name is not a Kubernetes name: it is not a DNS-1123",
        ),
    ],
)
def test_bad_node_names_are_refused_before_any_decision(args: dict[str, Any], why: str) -> None:
    made, _ = extender()
    with pytest.raises(MalformedArgs) as info:
        made.filter(args)
    assert str(info.value).startswith(why)
