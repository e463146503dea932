"""The cluster side's HTTP endpoints against the bodies once seen answered 500: the
extender's malformed bodies are 400 and say why, its size limit is 413, and well-formed
ones are answered; each answer checked as the fuzz checks it (tests/kube/test_http_fuzz.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from agent.legacy.cluster.extender import MAX_ARGS_BYTES
from tests.kube.http_fuzz_servers import (
    NODE,
    NS,
    Servers,
    binding,
    check_log,
    post,
    share_pod,
)

# -- the extender's malformed bodies -----------------------------------------------------

DEEP = b"[" * 50_000 + b"]" * 50_000  # within the values, past the depth
EXTENDER_MALFORMED: list[tuple[str, str, bytes | Any, str]] = [
    ("filter: an array", "/filter", [], "must be a JSON object"),
    ("filter: a string", "/filter", "ExtenderArgs", "must be a JSON object"),
    ("filter: a number", "/filter", 7, "must be a JSON object"),
    ("filter: 50,000 deep", "/filter", DEEP, "nested deeper than 64"),
    ("filter: objects 50,000 deep", "/filter", b'{"pod":' * 50_000 + b"1" + b"}" * 50_000,
     "nested deeper than 64"),
    ("filter: 100,001 values", "/filter", b"[" + b"0," * 100_000 + b"0]",
     "more than 100000 values"),
    ("filter: a number of 4,300 digits", "/filter", b'{"pod": ' + b"9" * 4300 + b"}",
     "more than 100 digits"),
    ("filter: not JSON", "/filter", b'{"pod": ', "not JSON"),
    ("filter: not UTF-8", "/filter", b'{"pod": "\xc3\x28"}', "not UTF-8"),
    ("filter: pod a string", "/filter", {"pod": "train-0", "nodenames": [NODE]}, "pod"),
    ("filter: pod a list", "/filter", {"pod": [share_pod()], "nodenames": [NODE]}, "pod"),
    ("filter: nodenames a number", "/filter", {"pod": share_pod(), "nodenames": 3}, "nodenames"),
    ("filter: nodenames an object", "/filter", {"pod": share_pod(), "nodenames": {"a": 1}},
     "nodenames"),
    ("filter: a node name a number", "/filter", {"pod": share_pod(), "nodenames": [NODE, 7]},
     "nodenames[1]"),
    ("filter: a node name with a newline", "/filter", {"pod": share_pod(), "nodenames": [
        "gpu-node-1\nforged"]}, "nodenames[0]"),
    ("filter: a node name too long", "/filter", {"pod": share_pod(), "nodenames": [
        "n" * 300]}, "nodenames[0]"),
    ("filter: nodes a list", "/filter", {"pod": share_pod(), "nodes": [NODE]}, "nodes"),
    ("filter: nodes.items not a list", "/filter", {"pod": share_pod(), "nodes": {"items": 5}},
     "nodes.items"),
    ("filter: an item not an object", "/filter", {"pod": share_pod(), "nodes": {"items": [
        NODE]}}, "nodes.items[0]"),
    ("filter: an item's metadata a list", "/filter", {"pod": share_pod(), "nodes": {"items": [
        {"metadata": []}]}}, "nodes.items[0]"),
    ("prioritize: an array", "/prioritize", [share_pod()], "must be a JSON object"),
    ("prioritize: 50,000 deep", "/prioritize", DEEP, "nested deeper than 64"),
    ("prioritize: pod a string", "/prioritize", {"pod": "x", "nodenames": [NODE]}, "pod"),
    ("prioritize: nodenames a number", "/prioritize", {"pod": share_pod(), "nodenames": 1e9},
     "nodenames"),
    ("bind: an array", "/bind", [binding()], "must be a JSON object"),
    ("bind: a string", "/bind", "train-0", "must be a JSON object"),
    ("bind: 50,000 deep", "/bind", DEEP, "nested deeper than 64"),
    ("bind: no PodUID", "/bind", {k: v for k, v in binding().items() if k != "PodUID"},
     "PodUID"),
    ("bind: PodName a list", "/bind", binding(PodName=["train-0"]), "PodName"),
    ("bind: PodName an object 10,000 deep", "/bind", json.dumps(binding(PodName=0)).replace(
        "0", '{"a":' * 60 + "0" + "}" * 60).encode(), "PodName"),
    ("bind: Node with a newline", "/bind", binding(Node="gpu-node-1\nINFO forged"), "Node"),
    ("bind: namespace with capitals", "/bind", binding(PodNamespace="Team-A"), "PodNamespace"),
    ("bind: a uid of a megabyte", "/bind", binding(PodUID="u" * 2**20), "PodUID"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [m[1:] for m in EXTENDER_MALFORMED],
    ids=[m[0] for m in EXTENDER_MALFORMED],
)
def test_malformed_extender_bodies_are_400(
    servers: Servers, path: str, body: bytes | Any, reason: str
) -> None:
    servers.log.records.clear()
    client = servers.client(path)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, answer = post(servers, client, path, data)
    finally:
        client.close()
    assert status == 400, answer[:300]
    assert reason in answer.decode(), answer[:300]
    assert len(answer) < 1000, answer[:300]  # says what is wrong, never repeats the body
    check_log(servers)


def test_the_extenders_size_limit(servers: Servers) -> None:
    """A body of MAX_ARGS_BYTES is read (and costs what any request may); one byte more is
    413, before anything is parsed."""
    args = json.dumps({"pod": share_pod(), "nodenames": [NODE]}).encode()
    client = servers.client("/filter")
    try:
        largest = args + b" " * (MAX_ARGS_BYTES - len(args))
        status, answer = post(servers, client, "/filter", largest)
        assert status == 200, answer[:300]
        assert json.loads(answer)["nodenames"] == [NODE]
        status, answer = client.send("POST", "/filter", largest + b" ")
        assert status == 413, answer[:300]
    finally:
        client.close()


WELL_FORMED: list[tuple[str, str, Any, Callable[[Any], bool]]] = [
    ("filter", "/filter", {"pod": share_pod(), "nodenames": [NODE, "gpu-node-2"]},
     lambda a: a["nodenames"] == [NODE] and "gpu-node-2" in a["failedNodes"]),
    ("filter with nodes", "/filter", {"pod": share_pod(), "nodes": {"items": [
        {"metadata": {"name": NODE}}]}}, lambda a: a["nodenames"] == [NODE]),
    ("filter without nodes", "/filter", {"pod": share_pod()}, lambda a: a["nodenames"] == []),
    ("filter, a bad ask", "/filter", {"pod": share_pod(**{"gpushare.io/threads": "\uff12\uff15"}),
                                      "nodenames": [NODE]},
     lambda a: a["failedAndUnresolvableNodes"][NODE].startswith("gpushare.io/threads")),
    ("filter, a pod with no metadata", "/filter", {"pod": {"spec": 1}, "nodenames": [NODE]},
     lambda a: a["nodenames"] == []),
    ("filter, a uid that is a number", "/filter", {"pod": {**share_pod(), "metadata": {
        **share_pod()["metadata"], "uid": 7}}, "nodenames": [NODE]},
     lambda a: a["nodenames"] == [NODE]),
    ("prioritize", "/prioritize", {"pod": share_pod(), "nodenames": [NODE]},
     lambda a: a[0]["Host"] == NODE and a[0]["Score"] > 0),
    ("prioritize, a uid that is an object", "/prioritize", {"pod": {**share_pod(), "metadata": {
        **share_pod()["metadata"], "uid": {"a": 1}}}, "nodenames": [NODE]},
     lambda a: a[0]["Host"] == NODE),
    ("bind of a pod that is gone", "/bind", binding(PodName="gone-0"),
     lambda a: a["Error"] == f"pod {NS}/gone-0 is gone"),
    ("bind in lower case", "/bind", {k.lower(): v for k, v in binding().items()},
     lambda a: a["Error"].endswith("is gone")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "expected"), [w[1:] for w in WELL_FORMED], ids=[w[0] for w in WELL_FORMED]
)
def test_well_formed_extender_bodies_are_answered(
    servers: Servers, path: str, body: Any, expected: Callable[[Any], bool]
) -> None:
    client = servers.client(path)
    try:
        status, answer = post(servers, client, path, json.dumps(body).encode())
    finally:
        client.close()
    assert status == 200, answer[:300]
    assert expected(json.loads(answer)), answer[:300]
