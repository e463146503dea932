"""What hypothesis sends to the cluster side's endpoints: JSON of any shape (arrays,
strings, deep nesting, huge numbers, Unicode), AdmissionReviews and extender arguments with
fields of any shape, annotation text of any shape (YAML aliases and bad tags included), and
raw bodies that are not JSON at all."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import strategies as st

from tests.kube.http_fuzz_servers import NODE, NS

POSTS = ("/filter", "/prioritize", "/bind", "/mutate", "/validate")
KEYS = (
    "pod", "nodenames", "nodes", "items", "metadata", "name", "namespace", "uid",
    "annotations", "spec", "containers", "initContainers", "ephemeralContainers", "env",
    "envFrom", "prefix", "value", "securityContext", "capabilities", "add", "privileged",
    "resources", "limits", "requests", "gpushare.io/share", "hostIPC", "hostPID",
    "PodName", "PodNamespace", "PodUID", "Node", "apiVersion", "kind", "request", "object",
    "oldObject", "operation", "subResource", "resource", "volumes", "hostPath", "path",
)  # fmt: skip
TEXTS = (
    "", "Pod", "pods", "CREATE", "UPDATE", "ephemeralcontainers", "status", NODE, NS,
    "admission.k8s.io/v1", "AdmissionReview", "gpushare", "20Gi", "\u0662\u0660Gi",
    "\uff12\uff15", "1e999", "9" * 1000, "a\nb", "\x1b[2J", "\u202e", "/run/gpushare",
    "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_", "SYS_ADMIN", "SYS_PTRACE", "ALL",
)  # fmt: skip
ANNOTATIONS = (
    "gpushare.io/memory", "gpushare.io/sizing", "gpushare.io/threads", "gpushare.io/priority",
    "gpushare.io/gang", "gpushare.io/gang-size", "gpushare.io/lease", "gpushare.io/node-agent",
)  # fmt: skip
YAML_TOKENS = (
    "{", "}", "[", "]", ",", ": ", "\n", "- ", "? ", "&a ", "&b ", "*a", "*b", "<<: ", "!!int ",
    "!!float ", "!!timestamp ", "!!binary ", "!!set ", "!!python/name:os.system ", "---\n",
    "parameters", "mode", "training", "inference", "dtype", "layers", "7e9", "1", "0x1F",
    "1:30", ".inf", "\u0667", "\uff17", "9" * 300, '"', "'", "#", "%YAML 1.1\n", "|\n  ",
)  # fmt: skip


def json_values(max_leaves: int = 25) -> st.SearchStrategy[Any]:
    leaves = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.integers(min_value=10**30, max_value=10**1000)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=40)
        | st.sampled_from(TEXTS)
    )
    keys = st.sampled_from(KEYS) | st.text(max_size=12)
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
        max_leaves=max_leaves,
    )


def alias_bombs() -> st.SearchStrategy[str]:
    """Each of up to nine levels up to nine aliases of the one below (9**10 leaves)."""

    def bomb(levels: int, fanout: int, wrap: bool) -> str:
        names = [f"l{i}" for i in range(levels + 1)]
        parts = [f"&{names[0]} [" + ",".join(["x"] * fanout) + "]"]
        for below, name in itertools.pairwise(names):
            parts.append(f"&{name} [" + ",".join([f"*{below}"] * fanout) + "]")
        body = "[" + ", ".join(parts) + "]"
        return "{mode: training, parameters: " + body + "}" if wrap else body

    uniform = st.sampled_from(range(1, 10))  # hypothesis draws small integers most often
    return st.builds(bomb, uniform, uniform, st.booleans())


ODD_NUMBERS = (
    "9" * 1000, "1e999", "-1", "0x" + "f" * 900, "1:" * 300 + "1", "\u0667e9", "!!int x",
    "!!float y", ".nan", "!!binary AA==",
)  # fmt: skip
ODD_YAML = (
    "!!timestamp 2024-13-45", "{mode: !!set {a}}", "? [a]\n: b", "\x1f", "!!int",
    "{mode: training, parameters: 7e9}\n---\n{}", "%TAG ! x\n--- !a b", "{<<: {a: 1}}",
)  # fmt: skip


def sizing_text() -> st.SearchStrategy[str]:
    """``gpushare.io/sizing`` values: YAML of any shape, aliases and bad tags included."""
    depth = st.sampled_from([1, 2, 3, 100, 340, 500, 1000]) | st.integers(1, 1100)
    field = st.sampled_from(["parameters", "mode", "layers", "dtype", "kv_heads"])
    value = st.sampled_from(ODD_NUMBERS) | json_values(5).map(json.dumps)
    return st.one_of(
        alias_bombs(),
        depth.map(lambda n: "[" * n + "]" * n),
        depth.map(lambda n: "{a: " * n + "1" + "}" * n),
        st.lists(st.sampled_from(YAML_TOKENS), max_size=40).map("".join),
        st.builds("{{mode: training, {}: {}}}".format, field, value),
        st.sampled_from(ODD_YAML),
        st.text(max_size=80),
    )


QUANTITY = (  # Kubernetes' grammar, with other scripts' digits among the ASCII ones
    r"\A[+-]?[0-9\u0660-\u0669\uff10-\uff19.]{0,70}([eE][0-9]{0,4})?"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|GiB|GB|b)?\Z"
)


def annotation_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=80), sizing_text(), st.from_regex(QUANTITY), st.sampled_from(TEXTS)
    )


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object with any of ``fields``."""
    return st.fixed_dictionaries({}, optional=fields)


def run_as_user() -> st.SearchStrategy[Any]:
    """UIDs, the edges of their range and beyond it, and any JSON."""
    edges = st.sampled_from([0, 1000, 4294967294, 4294967295, -1, 2**63, True, "1000"])
    return edges | st.integers() | json_values(2)


def containers() -> st.SearchStrategy[Any]:
    env = st.fixed_dictionaries(
        {"name": st.sampled_from(TEXTS) | st.text(max_size=30) | json_values(3)},
        optional={"value": json_values(3), "valueFrom": json_values(3)},
    )
    share = st.sampled_from(["1", 1, "2", 0]) | json_values(3)
    capabilities = st.lists(st.sampled_from(TEXTS) | json_values(2), max_size=4)
    container = st.fixed_dictionaries(
        {"name": st.text(max_size=10)},
        optional={
            "resources": optional(limits=st.fixed_dictionaries({"gpushare.io/share": share})),
            "env": st.lists(env, max_size=4) | json_values(3),
            "envFrom": st.lists(st.fixed_dictionaries({"prefix": json_values(2)}), max_size=2),
            "securityContext": optional(
                privileged=json_values(2),
                capabilities=st.fixed_dictionaries({"add": capabilities}),
                runAsUser=run_as_user(),
            ),
        },
    )
    return st.lists(container, max_size=3) | json_values(5)


def pods() -> st.SearchStrategy[Any]:
    annotations = st.dictionaries(
        st.sampled_from(ANNOTATIONS), annotation_text() | json_values(3), max_size=6
    )
    metadata = optional(
        name=st.text(max_size=60) | json_values(3),
        namespace=st.sampled_from([NS, ""]) | json_values(2),
        uid=st.sampled_from(["u-1"]) | json_values(2),
        annotations=annotations | json_values(5),
        finalizers=json_values(3),
    )
    path = json_values(2) | st.sampled_from(["/", "/run/gpushare", "/var/lib"])
    volume = st.fixed_dictionaries({"hostPath": st.fixed_dictionaries({"path": path})})
    spec = optional(
        containers=containers(),
        initContainers=containers(),
        ephemeralContainers=containers(),
        schedulerName=st.sampled_from(["gpushare", "default-scheduler"]) | json_values(2),
        nodeName=json_values(2),
        hostIPC=json_values(1),
        hostPID=json_values(1),
        hostNetwork=json_values(1),
        volumes=st.lists(volume, max_size=3),
        securityContext=optional(runAsUser=run_as_user()),
    )
    pod = st.fixed_dictionaries(
        {"metadata": metadata, "spec": spec}, optional={"kind": st.just("Pod")}
    )
    return pod | json_values(8)


def reviews() -> st.SearchStrategy[Any]:
    operations = st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"])
    kinds = st.sampled_from([{"group": "", "version": "v1", "kind": "Pod"}, {}])
    resources = st.just({"group": "", "version": "v1", "resource": "pods"})
    sub_resources = st.sampled_from(["", "ephemeralcontainers", "status"])
    request = st.fixed_dictionaries(
        {
            "uid": st.just("r-1") | json_values(2),
            "operation": operations | json_values(1),
            "object": pods(),
        },
        optional={
            "kind": kinds | json_values(2),
            "resource": resources | json_values(2),
            "subResource": sub_resources | json_values(1),
            "namespace": st.just(NS) | json_values(1),
            "oldObject": pods(),
        },
    )
    return st.fixed_dictionaries(
        {
            "apiVersion": st.just("admission.k8s.io/v1"),
            "kind": st.just("AdmissionReview"),
            "request": request,
        }
    )


def extender_args() -> st.SearchStrategy[Any]:
    names = st.lists(st.sampled_from([NODE, "gpu-node-2"]) | st.text(max_size=20), max_size=8)
    item = st.fixed_dictionaries(
        {"metadata": st.fixed_dictionaries({"name": st.just(NODE) | json_values(1)})}
    )
    nodes = st.fixed_dictionaries({"items": st.lists(item, max_size=3)})
    filter_args = optional(
        pod=pods(), nodenames=names | json_values(3), nodes=nodes | json_values(3)
    )
    name = st.sampled_from([NODE, NS, "train-0", "u-1"]) | json_values(2)
    bind_args = optional(PodName=name, PodNamespace=name, PodUID=name, Node=name)
    return filter_args | bind_args


def raw_bodies() -> st.SearchStrategy[bytes]:
    nesting = st.integers(1, 200_000).flatmap(
        lambda n: st.sampled_from([b"[" * n + b"]" * n, b"[" * n, b'{"a":' * n + b"1" + b"}" * n])
    )
    return st.one_of(
        st.binary(max_size=300),
        nesting,
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.text(max_size=50).map(lambda t: json.dumps(t).encode("utf-16")),
        st.integers(1, 20_000).map(lambda n: b"[" + b"1," * n + b"1]"),
    )
