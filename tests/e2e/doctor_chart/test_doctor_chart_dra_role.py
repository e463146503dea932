"""`gpushare doctor`'s Kubernetes checks on the DRA path (the node of conftest.py), with
the agent's token granted the ClusterRole of deploy/dra/rbac.yaml as the chart renders it,
or less: red, naming the rule, where the role cannot read the Node or no RuntimeClass
nvidia exists; a warning where it may not read RuntimeClasses."""

from __future__ import annotations

import pytest

from tests.e2e.doctor_chart.chart import Node, assert_runtime_class_not_checked
from tests.e2e.doctor_chart.cluster import NODE, USER

DRA_ONLY = pytest.mark.parametrize("node", ["dra"], indirect=True)  # the only path with an API


@DRA_ONLY
def test_dra_a_missing_runtime_class(node: Node) -> None:
    assert node.cluster is not None
    readable = node.cluster.role.granting("node.k8s.io", "runtimeclasses", "get")
    node.cluster.runtime_classes.discard("nvidia")
    try:
        with node.cluster.granted(readable):
            code, lines = node.doctor()
    finally:
        node.cluster.runtime_classes.add("nvidia")
    assert code == 1
    assert lines["runtime-class"] == (
        "fail",
        "no RuntimeClass nvidia: the agent's and the workloads' pods run under it  fix: install "
        "the NVIDIA container toolkit with the GPU Operator (it creates it), or create a "
        "RuntimeClass nvidia with handler nvidia",
    )


@DRA_ONLY
def test_dra_a_role_that_may_not_read_runtime_classes(node: Node) -> None:
    assert node.cluster is not None
    with node.cluster.granted(node.cluster.role.without("node.k8s.io", "runtimeclasses")):
        code, lines = node.doctor()
    assert code == 0, lines
    assert_runtime_class_not_checked(node, lines["runtime-class"])


@DRA_ONLY
def test_dra_a_role_that_may_not_read_the_node(node: Node) -> None:
    assert node.cluster is not None
    with node.cluster.granted(node.cluster.role.without("", "nodes")):
        code, lines = node.doctor()
    assert code == 1
    for check in ("node-label", "nvidia-device-plugin"):
        status, rest = lines[check]
        assert status == "fail"
        assert rest.startswith(f"node {NODE} not read from {node.cluster.url}: 403 Forbidden")
        assert (
            f"fix: the token of dra.api_token_file {node.root}/token must get nodes, as the DRA "
            "driver reads its Node: bind it the chart's ClusterRole gpushare-dra-driver" in rest
        )
        assert f"`kubectl auth can-i get nodes --as={USER}`" in rest
