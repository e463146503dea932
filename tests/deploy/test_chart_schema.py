"""values.schema.json types every value of values.yaml and refuses wrong ones naming them;
NOTES.txt says the next commands in the release's namespace (issue 39)."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python
import jsonschema
import pytest

from tests.deploy.chart_values import NAMESPACE, VALUES
from tests.deploy.test_chart import (
    CHART,
    KUBE_VERSION,
    RENDER,
    objects,
    pod_of,
    render,
)

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


# -- 11. the schema and NOTES.txt -------------------------------------------------------------


def test_the_schema_is_valid_and_types_every_value_of_values_yaml() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator(SCHEMA).validate(VALUES)
    assert SCHEMA["additionalProperties"] is False
    assert set(SCHEMA["properties"]) == set(VALUES), "every top-level key, and no other"

    def typed(value: Any, schema: dict[str, Any], where: str) -> None:
        if "$ref" in schema:
            schema = SCHEMA["definitions"][schema["$ref"].rsplit("/", 1)[1]]
        assert {"type", "enum", "anyOf", "const"} & set(schema), f"{where} has no type"
        if isinstance(value, dict) and "properties" in schema:
            for key, inner in value.items():
                assert key in schema["properties"], f"{where}.{key} is not in the schema"
                typed(inner, schema["properties"][key], f"{where}.{key}")

    for key, value in VALUES.items():
        typed(value, SCHEMA["properties"][key], key)


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"path": "device-plugin"}, "/path"),
        ({"nodeSelctor": {"gpushare.io/node": "true"}}, "nodeSelctor"),
        ({"scheduler": {"version": "1.31"}}, "/scheduler/version"),
        ({"scheduler": {"verison": "v1.31.0"}}, "verison"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"certificates": {"issuer": {"kind": "Vault"}}}, "/certificates/issuer/kind"),
        ({"mpsHost": {"resources": {"limits": {"memory": "lots"}}}}, "/mpsHost/resources"),
        ({"agent": {"holdS": "thirty"}}, "/agent/holdS"),
        ({"draController": {"stallS": 60}}, "/draController/stallS"),
        ({"shm": {"size": "big"}}, "/shm/size"),
        ({"tolerations": [{"key": "k", "operator": "Maybe"}]}, "/tolerations/0/operator"),
        ({"nodeSelectorMigrated": "yes"}, "/nodeSelectorMigrated"),
        ({"telemetry": {"dcgmExporter": {"enabled": "yes"}}}, "/telemetry/dcgmExporter/enabled"),
        ({"telemetry": {"dcgmExporter": {"url": "localhost:9400"}}}, "/telemetry/dcgmExporter/url"),
        ({"telemetry": {"dcgmHostEngine": {"hots": "$(HOST_IP)"}}}, "hots"),
        ({"agentConfig": ["telemetry.source=nvml"]}, "/agentConfig"),
        ({"agentConfig": {"telemetri": {"source": "nvml"}}}, "telemetri"),
        ({"agentConfig": {"telemetry": {"sourse": "nvml"}}}, "sourse"),
        ({"agentConfig": {"telemetry": {"source": "prometheus"}}}, "/agentConfig/telemetry/source"),
        ({"agentConfig": {"estimator": {"coverage": 2}}}, "/agentConfig/estimator/coverage"),
        ({"agentConfig": {"runtime": {"lock_wait_s": [60]}}}, "/agentConfig/runtime/lock_wait_s"),
        ({"certificates": {"mode": "selfSigned"}}, "/certificates/mode"),
        ({"certificates": {"generated": {"days": "1y"}}}, "/certificates/generated/days"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else v,
)
def test_the_schema_refuses_a_wrong_value_naming_it(values: dict[str, Any], said: str) -> None:
    with pytest.raises(helm_python.HelmError, match=re.escape(said)):
        render(values)


def notes(values: dict[str, Any], namespace: str = NAMESPACE) -> str:
    return str(
        RENDER.render_all(values, namespace=namespace, kube_version=KUBE_VERSION)["NOTES.txt"]
    )


def test_the_notes_say_the_next_three_commands_in_the_release_namespace() -> None:
    text = notes({})
    assert "kubectl label node <NODE> gpushare.io/node=true" in text
    assert f"kubectl -n {NAMESPACE} get pods -o wide -l app.kubernetes.io/part-of=gpushare" in text
    doctor = f"kubectl -n {NAMESPACE} exec <AGENT POD> -c agent -- gpushare"
    assert doctor in text and " doctor" in text.split(doctor, 1)[1].splitlines()[0]
    assert "gpushare-system" not in text
    # the doctor reads the chart's config file, as the agent does
    config = pod_of(objects(), "DaemonSet", "gpushare-agent")["containers"][0]["args"]
    assert f"--config {config[config.index('--config') + 1]} doctor" in text
    mine = notes({"nodeSelector": {"pool": "a100"}, "runtimeClassName": "nvidia-cdi"})
    assert "kubectl label node" not in mine and '{"pool":"a100"}' in mine
    assert "doctor --runtime-class nvidia-cdi" in mine
    assert "<no value>" not in text + mine
