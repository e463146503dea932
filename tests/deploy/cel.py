"""The API server's evaluation of a ValidatingAdmissionPolicy, in Python: the chart's
admission policies' CEL (templates/policy/) is evaluated on sample objects with the
pure-Python CEL evaluator cel-python (``celpy``) by tests/deploy/test_run_as_user_policy.py
and tests/deploy/test_one_gpu_policy.py.

How the API server decides, and what this module does the same way: the policy's
matchConstraints and the binding's matchResources (its namespaceSelector, a label selector,
evaluated here in Python) pick the requests; every matchCondition must be true, or the
policy does not apply; then each validation must be true, or the request is refused with
the validation's messageExpression (else its message). The CEL sees ``object``,
``oldObject`` (null on CREATE), ``request``, ``params`` (null: no paramKind) and, in
validations, ``variables``. The API server evaluates variables lazily, this module in
their order: stricter (an error in an unused variable fails here too). An evaluation error
fails the test: with failurePolicy Fail it would refuse the request. A rule's matchPolicy
Equivalent (the API server converting a request of another version to the rule's) is not
modelled: a request is matched on the version it names.

The real API server runs cel-go, with Kubernetes' libraries; every construct the policies
use is core CEL that both implement (has() on maps, `in` on a map's keys and on a list,
exists/filter/map, the conditional, list concatenation and indexing, size(), string()).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import yaml
from celpy import celtypes

ENV = celpy.Environment()


def cel(expression: str, activation: Mapping[str, Any]) -> Any:
    """``expression`` evaluated on ``activation``; a CEL error raises (CELEvalError)."""
    return ENV.program(ENV.compile(expression)).evaluate(dict(activation))


def label_selector_selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes' label selector (matchLabels, matchExpressions) on ``labels``."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        found = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }
        if not found[operator]:
            return False
    return True


def namespace(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Namespace as the API server keeps it: kubernetes.io/metadata.name is its name."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {**(labels or {}), "kubernetes.io/metadata.name": name},
        },
    }


@dataclass(frozen=True)
class Outcome:
    matched: bool  # the policy applies to the request (binding, constraints, conditions)
    refusal: str | None = None  # the first failed validation's message

    @property
    def allowed(self) -> bool:
        return self.refusal is None


@dataclass(frozen=True)
class Policy:
    """A ValidatingAdmissionPolicy and its one binding, as rendered."""

    policy: dict[str, Any]
    binding: dict[str, Any]

    def admit(
        self,
        obj: dict[str, Any] | None,
        *,
        operation: str = "CREATE",
        resource: tuple[str, str, str] = ("", "v1", "pods"),
        old: dict[str, Any] | None = None,
        username: str = "alice",
        extra: dict[str, list[str]] | None = None,
        ns: dict[str, Any] | None = None,
    ) -> Outcome:
        spec, binding = self.policy["spec"], self.binding["spec"]
        assert binding["policyName"] == self.policy["metadata"]["name"]
        assert binding["validationActions"] == ["Deny"] and spec["failurePolicy"] == "Fail"
        assert "paramKind" not in spec and "paramRef" not in binding
        rules = spec["matchConstraints"]["resourceRules"]
        if not any(rule_matches(r, operation, resource) for r in rules):
            return Outcome(matched=False)
        match = binding.get("matchResources")
        if match:
            assert set(match) == {"namespaceSelector"}, match  # nothing else is evaluated here
            assert ns is not None, "a namespaced request needs its namespace"
            if not label_selector_selects(match["namespaceSelector"], ns["metadata"]["labels"]):
                return Outcome(matched=False)
        user: dict[str, Any] = {"username": username}
        if extra is not None:
            user["extra"] = extra
        request = {"operation": operation, "userInfo": user}
        if ns is not None:
            request["namespace"] = ns["metadata"]["name"]
        activation: dict[str, Any] = {
            "object": celpy.json_to_cel(obj),
            "oldObject": celpy.json_to_cel(old),
            "request": celpy.json_to_cel(request),
            "params": None,
            "namespaceObject": celpy.json_to_cel(ns),
        }
        for condition in spec.get("matchConditions", []):
            if not cel(condition["expression"], activation):
                return Outcome(matched=False)
        variables: dict[str, Any] = {}
        activation["variables"] = celtypes.MapType()
        for variable in spec.get("variables", []):
            variables[variable["name"]] = cel(variable["expression"], activation)
            activation["variables"] = celtypes.MapType(
                {celtypes.StringType(k): v for k, v in variables.items()}
            )
        for validation in spec["validations"]:
            if cel(validation["expression"], activation):
                continue
            message = validation.get("message") or f"failed expression: {validation['expression']}"
            if "messageExpression" in validation:
                message = str(cel(validation["messageExpression"], activation)) or message
            return Outcome(matched=True, refusal=message)
        return Outcome(matched=True)


def rule_matches(rule: Mapping[str, Any], operation: str, resource: tuple[str, str, str]) -> bool:
    group, version, plural = resource
    return all(
        wanted in rule[field] or "*" in rule[field]
        for field, wanted in (
            ("apiGroups", group), ("apiVersions", version),
            ("resources", plural), ("operations", operation),
        )
    )  # fmt: skip


def policies(docs: list[dict[str, Any]]) -> dict[str, Policy]:
    """{name: Policy} of the documents' policies, each with its one binding."""
    found = {}
    for doc in docs:
        if doc["kind"] == "ValidatingAdmissionPolicy":
            name = doc["metadata"]["name"]
            [binding] = [
                d for d in docs
                if d["kind"] == "ValidatingAdmissionPolicyBinding"
                and d["spec"]["policyName"] == name
            ]  # fmt: skip
            found[name] = Policy(doc, binding)
    return found


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]
