"""The chart's agent settings: ``agentConfig`` is merged over the configuration the chart
makes (its keys replace the chart's, null drops one, the rest stays the chart's), a wrong
key or value in it stops the agent with the key named, and the settings the chart sets from
the pod's environment are refused there; the values ``telemetry.*`` point the agent at a
dcgm-exporter (or DCGM) on the node's address, which the agent's settings resolve from the
downward API's ``status.hostIP`` and which the agent's telemetry then scrapes.

The agent is run as Kubernetes runs it: its config file as rendered, its container's
environment with ``$(VAR)`` expanded as the kubelet does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from aiohttp import web

from agent.config.loading import load_settings, settings_as_dict
from agent.core.errors import ConfigError
from agent.runtime.wiring import build_telemetry, select_telemetry
from tests.deploy.test_chart import RENDER
from tests.helpers import REPO
from tests.integration.gpu.test_exporter_http import KNOWN, SECOND, Exporter

CHART = REPO / "deploy" / "helm" / "gpushare"
PATHS = ("extender", "dra", "both")
NODE = "gpu-node-7"
# What an offline render needs besides the values a test gives (the cluster's version).
BASE: dict[str, Any] = {"scheduler": {"version": "v1.31.0"}}


def objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for text in RENDER.render({**BASE, **values}, namespace="gpushare").values():
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def config_text(docs: list[dict[str, Any]]) -> str:
    (configmap,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-agent-config"
    ]
    return str(configmap["data"]["config.yaml"])


def agent_env(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (daemonset,) = [
        d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "gpushare-agent"
    ]
    (agent,) = [
        c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"
    ]
    return list(agent["env"])


def kubelet_env(env: list[dict[str, Any]], *, host_ip: str) -> dict[str, str]:
    """The container's environment as the kubelet gives it: fieldRefs from the pod, and
    $(NAME) in a value replaced by an earlier variable's value ($$: a literal $; an
    unknown name stays as written)."""
    fields = {"spec.nodeName": NODE, "status.hostIP": host_ip}
    resolved: dict[str, str] = {}
    for var in env:
        if "valueFrom" in var:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            resolved[var["name"]] = fields.get(path, f"<{path}>")
            continue
        resolved[var["name"]] = re.sub(
            r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
            lambda m: "$" if m.group(0) == "$$" else resolved.get(m.group(1), m.group(0)),
            str(var.get("value", "")),
        )
    return resolved


def run_agent(
    args: list[str], config: str, env: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """``python -m agent --config FILE ARGS`` with the container's environment (and none of
    the test session's GPUSHARE_* variables)."""
    path = tmp_path / "config.yaml"
    path.write_text(config)
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    return subprocess.run(
        [sys.executable, "-m", "agent", "--config", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**base, **env},
    )


# -- agentConfig ---------------------------------------------------------------------------


OVERRIDES: dict[str, Any] = {
    "telemetry": {"source": "exporter", "window_s": 20},  # a group the chart does not set
    "estimator": {"coverage": 0.95, "profiles_dir": "/etc/gpushare/profiles"},
    "readiness": {"deadline_s": 300},  # the chart sets 600 and policy, which stays
    "runtime": {"shutdown_grace_s": None},  # null: the agent's default, not the chart's 20
    "admission": {"max_events": 1_000_000, "memory_reserve": "2GiB"},  # as written
}


@pytest.mark.parametrize("path", PATHS)
def test_agent_config_is_merged_over_the_charts_configuration(path: str) -> None:
    chart = load_settings(config_text(objects({"path": path})))
    merged = load_settings(config_text(objects({"path": path, "agentConfig": OVERRIDES})))
    defaults = load_settings("version: 1")
    assert chart.readiness.deadline_s == 600 and chart.runtime.shutdown_grace_s == 20
    assert merged.telemetry.source == "exporter" and merged.telemetry.window_s == 20
    assert merged.estimator.coverage == 0.95
    assert merged.admission.max_events == 1_000_000 and merged.admission.memory_reserve == "2GiB"
    assert merged.readiness.deadline_s == 300
    assert merged.readiness.policy == chart.readiness.policy
    assert merged.runtime.shutdown_grace_s == defaults.runtime.shutdown_grace_s
    # Everything else is the chart's, key for key.
    given = {f"{group}.{key}" for group, body in OVERRIDES.items() for key in body}
    ours, theirs = settings_as_dict(chart), settings_as_dict(merged)
    for group, body in ours.items():
        if group == "version":
            continue
        for key, value in body.items():
            if f"{group}.{key}" not in given:
                assert theirs[group][key] == value, f"{group}.{key}"


def test_without_agent_config_the_chart_renders_its_own_configuration() -> None:
    empty = config_text(objects({"agentConfig": {}}))
    assert empty == config_text(objects({}))
    assert "# The daemons run in their own DaemonSet" in empty  # the commented text as it was
    assert load_settings(empty) == load_settings(config_text(objects({"agentConfig": None})))


BAD = [
    # (agentConfig, the key the agent names)
    ({"telemetry": {"exporter_uri": "http://x/metrics"}}, "telemetry.exporter_uri"),
    ({"telemetri": {"window_s": 1}}, "telemetri"),
    ({"estimator": {"coverage": 2}}, "estimator.coverage"),
    ({"runtime": {"log_level": "loud"}}, "runtime.log_level"),
    ({"readiness": "fast"}, "readiness"),
]


@pytest.mark.parametrize(("agent_config", "key"), BAD, ids=[key for _c, key in BAD])
def test_a_wrong_key_or_value_is_refused_at_render_and_stops_the_agent_naming_it(
    agent_config: dict[str, Any], key: str, tmp_path: Path
) -> None:
    # values.schema.json (the agent's own settings) refuses it when Helm renders ...
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(key.rsplit(".", 1)[-1])):
        objects({"agentConfig": agent_config})
    # ... and the agent when it starts with it anyway (a ConfigMap edited by hand, a chart
    # rendered without its schema): the chart's file with it merged as the template does.
    docs = objects({})
    chart = yaml.safe_load(config_text(docs))
    for group, body in agent_config.items():
        chart[group] = {**chart.get(group, {}), **body} if isinstance(body, dict) else body
    config = yaml.safe_dump(chart)
    env = kubelet_env(agent_env(docs), host_ip="10.0.0.7")
    # Refused by the loader first: `serve` below never gets as far as starting an agent.
    with pytest.raises(ConfigError) as refused:
        load_settings(config, env=env)
    assert refused.value.key == key
    done = run_agent(["serve"], config, env, tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"configuration error: {key}" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"agentConfig": {"runtime": {"node_name": "x"}}}, "agentConfig.runtime.node_name"),
        (
            {"agentConfig": {"telemetry": {"exporter_url": "http://x:9400/metrics"}}},
            "agentConfig.telemetry.exporter_url",
        ),
        (
            {
                "telemetry": {"dcgmHostEngine": {"enabled": True}},
                "agentConfig": {"telemetry": {"dcgm_host": "x"}},
            },
            "agentConfig.telemetry.dcgm_host",
        ),
        # The chart's values.schema.json, or the template without it, refuses a list.
        ({"agentConfig": ["telemetry"]}, r"agentConfig.*(must be a mapping|want object)"),
        ({"telemetry": {"dcgmExporter": {"url": ""}}}, "telemetry.dcgmExporter.url"),
    ],
)
def test_settings_the_environment_sets_are_refused_in_agent_config(
    values: dict[str, Any], said: str
) -> None:
    with pytest.raises(helm_python.HelmError, match=said):
        RENDER.render({**BASE, **values})


def test_with_the_exporter_off_agent_config_sets_the_exporter_url() -> None:
    url = "http://dcgm-exporter.monitoring.svc:9400/metrics"
    docs = objects(
        {
            "telemetry": {"dcgmExporter": {"enabled": False}},
            "agentConfig": {"telemetry": {"exporter_url": url}},
        }
    )
    env = kubelet_env(agent_env(docs), host_ip="10.0.0.7")
    assert not any(name.startswith("GPUSHARE_TELEMETRY_") for name in env)
    assert load_settings(config_text(docs), env=env).telemetry.exporter_url == url


# -- DCGM and dcgm-exporter on the node's address ----------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_the_agent_resolves_the_exporter_and_dcgm_to_the_nodes_address(
    path: str, tmp_path: Path
) -> None:
    docs = objects({"path": path, "telemetry": {"dcgmHostEngine": {"enabled": True}}})
    env = kubelet_env(agent_env(docs), host_ip="10.20.30.40")
    done = run_agent(["config", "show", "--resolved", "--json"], config_text(docs), env, tmp_path)
    assert done.returncode == 0, done.stderr
    settings = json.loads(done.stdout)
    assert settings["telemetry"]["exporter_url"] == "http://10.20.30.40:9400/metrics"
    assert settings["telemetry"]["dcgm_host"] == "10.20.30.40"
    assert settings["telemetry"]["source"] == "auto"
    assert settings["runtime"]["node_name"] == NODE


def test_by_default_only_the_exporter_is_looked_for_on_the_node() -> None:
    docs = objects({})
    env = kubelet_env(agent_env(docs), host_ip="10.20.30.40")
    settings = load_settings(config_text(docs), env=env)
    assert settings.telemetry.exporter_url == "http://10.20.30.40:9400/metrics"
    assert settings.telemetry.dcgm_host == load_settings("version: 1").telemetry.dcgm_host
    off = objects({"telemetry": {"dcgmExporter": {"enabled": False}}})
    off_env = kubelet_env(agent_env(off), host_ip="10.20.30.40")
    assert "GPUSHARE_TELEMETRY_EXPORTER_URL" not in off_env and "HOST_IP" in off_env
    assert load_settings(config_text(off), env=off_env).telemetry.exporter_url == (
        load_settings("version: 1").telemetry.exporter_url
    )


# 127.0.0.2 stands for the node's address: not the agent's default (127.0.0.1), so only
# a URL resolved from HOST_IP reaches the stand-in exporter.
NODE_IP = "127.0.0.2"


@pytest.fixture
async def node_exporter() -> AsyncIterator[tuple[Exporter, int]]:
    fake = Exporter()
    app = web.Application()
    app.router.add_get("/metrics", fake.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, NODE_IP, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, port
    await runner.cleanup()


async def test_the_agent_scrapes_the_exporter_on_the_nodes_address(
    node_exporter: tuple[Exporter, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, port = node_exporter
    docs = objects({"telemetry": {"dcgmExporter": {"url": f"http://$(HOST_IP):{port}/metrics"}}})
    env = kubelet_env(agent_env(docs), host_ip=NODE_IP)
    settings = load_settings(config_text(docs), env=env)
    assert settings.telemetry.exporter_url == f"http://{NODE_IP}:{port}/metrics"
    monkeypatch.setattr(sys, "path", list(sys.path))  # the DCGM probe looks in more folders
    # The agent's own choice (telemetry.source auto): DCGM, then the exporter, then NVML.
    source = await select_telemetry(build_telemetry(settings), [KNOWN, SECOND])
    try:
        assert source.name == "dcgm-exporter"
        samples = await source.read([KNOWN, SECOND])
    finally:
        await source.aclose()
    assert {s.device_uuid for s in samples} == {KNOWN.uuid, SECOND.uuid}
    assert fake.hits >= 2  # the first read that chose it, and this one


def test_a_change_of_agent_config_rolls_the_agents() -> None:
    def config_hash(values: dict[str, Any]) -> str:
        (daemonset,) = [
            d
            for d in objects(values)
            if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "gpushare-agent"
        ]
        return str(
            daemonset["spec"]["template"]["metadata"]["annotations"]["gpushare.io/config-hash"]
        )

    assert config_hash({}) != config_hash({"agentConfig": {"readiness": {"deadline_s": 300}}})


def test_the_schema_of_agent_config_is_the_agent_s_settings() -> None:
    """values.schema.json's agentConfig lists every group and key the agent knows, typed as
    its loader reads them (deploy/helm/render.py): a new setting fails here until the
    schema has it (`deploy/render.sh` writes it)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["agentConfig"] == {"$ref": "#/definitions/agentConfig"}
    assert schema["definitions"]["agentConfig"] == RENDER.agent_config_schema()


def test_agent_config_keys_of_every_kind_render() -> None:
    """What the schema lets through renders: a choice, a bound, a boolean given as a word,
    a number as a string, null (the chart's key dropped)."""
    config = yaml.safe_load(
        config_text(
            objects(
                {
                    "agentConfig": {
                        "telemetry": {"source": "exporter"},
                        "estimator": {"coverage": 0.9},
                        "kubelet": {"enabled": "yes"},
                        "runtime": {"lock_wait_s": "30", "log_format": None},
                    }
                }
            )
        )
    )
    assert config["telemetry"]["source"] == "exporter"
    assert config["kubelet"]["enabled"] == "yes" and config["runtime"]["lock_wait_s"] == "30"
    assert "log_format" not in config["runtime"]
    load_settings(yaml.safe_dump(config))  # and the agent takes it
