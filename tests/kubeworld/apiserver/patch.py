"""PATCH bodies: merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch
(a merge patch whose lists in :data:`MERGE_KEYS` merge by their key)."""

from __future__ import annotations

from typing import Any

from tests.kubeworld.apiserver.errors import ApiError
from tests.kubeworld.apiserver.objects import Obj, copy_json

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
MERGE_KEYS = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("status", "containerStatuses"): "name",
    ("status", "initContainerStatuses"): "name",
}


# -- patches -------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy_json(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """A merge patch whose lists in :data:`MERGE_KEYS` are merged by their key."""
    if not isinstance(patch, dict):
        return copy_json(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        where = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and where in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[where], where)
        else:
            result[key] = strategic_merge_patch(result.get(key), value, where)
    return result


def _merge_list(old: list[Any], new: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    merged = [copy_json(item) for item in old]
    for item in new:
        if not isinstance(item, dict) or key not in item:
            raise ApiError(400, f"map: {item!r} does not contain declared merge key: {key}")
        at = next((i for i, o in enumerate(merged) if o.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del merged[at]
        elif at is None:
            merged.append(strategic_merge_patch({}, item, path))
        else:
            merged[at] = strategic_merge_patch(merged[at], item, path)
    return merged


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ApiError(422, f"invalid JSON pointer: {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _parent(doc: Any, tokens: list[str], path: str) -> tuple[Any, str]:
    if not tokens:
        raise ApiError(422, f"cannot operate on the whole document at {path!r}")
    node = doc
    for token in tokens[:-1]:
        node = _child(node, token, path)
    return node, tokens[-1]


def _child(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict) and token in node:
        return node[token]
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return node[int(token)]
    raise ApiError(422, f"doc is missing path: {path!r}: missing value")


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902."""
    if not isinstance(ops, list):
        raise ApiError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy_json(doc)
    for op in ops:
        kind, path = op.get("op"), op.get("path")
        tokens = _pointer(path)
        if kind == "test":
            found = doc
            for token in tokens:
                found = _child(found, token, path)
            if found != op.get("value"):
                raise ApiError(422, f"testing value {path} failed: test failed")
            continue
        if kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value: Any = doc
            for token in source:
                value = _child(value, token, op.get("from"))
            value = copy_json(value)
            if kind == "move":
                doc = _remove(doc, source, op["from"])
            doc = _add(doc, tokens, value, path)
        elif kind == "add":
            doc = _add(doc, tokens, copy_json(op.get("value")), path)
        elif kind == "remove":
            doc = _remove(doc, tokens, path)
        elif kind == "replace":
            doc = _remove(doc, tokens, path)
            doc = _add(doc, tokens, copy_json(op.get("value")), path)
        else:
            raise ApiError(400, f"Unexpected kind: {kind}")
    return doc


def _add(doc: Any, tokens: list[str], value: Any, path: str) -> Any:
    if not tokens:
        return value
    parent, last = _parent(doc, tokens, path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and (
        last == "-" or (last.isdigit() and int(last) <= len(parent))
    ):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        raise ApiError(422, f"add operation does not apply: doc is missing path: {path!r}")
    return doc


def _remove(doc: Any, tokens: list[str], path: str) -> Any:
    parent, last = _parent(doc, tokens, path)
    _child(parent, last, path)  # it must exist
    del parent[int(last) if isinstance(parent, list) else last]
    return doc


def apply_patch(content_type: str, doc: Obj, patch: Any) -> Obj:
    if content_type == MERGE_PATCH:
        result = merge_patch(doc, patch)
    elif content_type == STRATEGIC_PATCH:
        result = strategic_merge_patch(doc, patch)
    elif content_type == JSON_PATCH:
        result = json_patch(doc, patch)
    else:
        raise ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{JSON_PATCH}, {MERGE_PATCH}, application/apply-patch+yaml, {STRATEGIC_PATCH}",
        )
    if not isinstance(result, dict):
        raise ApiError(422, "the patched object is not an object")
    return result
