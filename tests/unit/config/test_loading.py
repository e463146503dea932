import dataclasses

import pytest
import yaml

from agent.config import CONFIG_VERSION, Settings, load_settings, settings_as_dict
from agent.config.loading import env_name, setting_fields
from agent.core.errors import ConfigError

FILE = """
version: 1
telemetry:
  sample_interval_s: 2
  window_s: 20
runtime:
  log_level: warning
"""


def test_defaults_without_any_source() -> None:
    assert load_settings() == Settings()


def test_precedence_file_then_env_then_flags() -> None:
    settings = load_settings(
        FILE,
        env={"GPUSHARE_TELEMETRY_WINDOW_S": "30", "GPUSHARE_RUNTIME_LOG_LEVEL": "error"},
        overrides={"runtime.log_level": "debug"},
    )
    assert settings.telemetry.sample_interval_s == 2.0  # file
    assert settings.telemetry.window_s == 30.0  # env beats file
    assert settings.runtime.log_level == "debug"  # flag beats env
    assert isinstance(settings.telemetry.sample_interval_s, float)


BAD_INPUTS = [
    # (description, file text, env, overrides, key named in the error)
    (
        "unknown key in a group",
        "version: 1\ntelemetry:\n  sample_intervall_s: 1\n",
        {},
        {},
        "telemetry.sample_intervall_s",
    ),
    ("unknown group", "version: 1\ntelemetri:\n  window_s: 1\n", {}, {}, "telemetri"),
    (
        "negative interval",
        "version: 1\ntelemetry:\n  sample_interval_s: -1\n",
        {},
        {},
        "telemetry.sample_interval_s",
    ),
    (
        "string for a number",
        "version: 1\ntelemetry:\n  window_s: soon\n",
        {},
        {},
        "telemetry.window_s",
    ),
    (
        "bool for a number",
        "version: 1\ntelemetry:\n  window_s: true\n",
        {},
        {},
        "telemetry.window_s",
    ),
    (
        "value outside its choices",
        "version: 1\nruntime:\n  log_level: loud\n",
        {},
        {},
        "runtime.log_level",
    ),
    ("missing version", "telemetry:\n  window_s: 5\n", {}, {}, "version"),
    ("future version", "version: 2\n", {}, {}, "version"),
    ("group is not a mapping", "version: 1\ntelemetry: 5\n", {}, {}, "telemetry"),
    (
        "unknown env setting in a known group",
        None,
        {"GPUSHARE_TELEMETRY_NOPE": "1"},
        {},
        "GPUSHARE_TELEMETRY_NOPE",
    ),
    ("bad env value", None, {"GPUSHARE_TELEMETRY_WINDOW_S": "abc"}, {}, "telemetry.window_s"),
    ("infinite number", None, {"GPUSHARE_TELEMETRY_WINDOW_S": "inf"}, {}, "telemetry.window_s"),
    ("unknown flag", None, {}, {"api.nope": "x"}, "api.nope"),
    ("bad bool", None, {"GPUSHARE_SIM_ENABLED": "maybe"}, {}, "sim.enabled"),
    (
        "window shorter than the sampling period",
        None,
        {},
        {"telemetry.window_s": "0.5", "telemetry.sample_interval_s": "1"},
        "telemetry.window_s",
    ),
    (
        "thread percentage over 100",
        None,
        {},
        {"mps.default_thread_pct": "150"},
        "mps.default_thread_pct",
    ),
]


@pytest.mark.parametrize(("description", "text", "env", "overrides", "key"), BAD_INPUTS)
def test_bad_input_names_the_key(
    description: str, text: str | None, env: dict[str, str], overrides: dict[str, str], key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(text, env=env, overrides=overrides)
    assert info.value.key == key, description
    assert key in str(info.value)


@pytest.mark.parametrize("text", ["version: 1\n  bad: [yaml\n", "- a list\n", "just a string"])
def test_not_a_settings_document(text: str) -> None:
    with pytest.raises(ConfigError):
        load_settings(text)


def test_unrelated_environment_is_ignored() -> None:
    env = {"PATH": "/bin", "GPUSHARE_CONFIG": "/x.yaml", "GPUSHARE_SOCKET": "/s", "HOME": "/h"}
    assert load_settings(env=env) == Settings()


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("0", False), ("YES", True)])
def test_bool_spellings(raw: str, expected: bool) -> None:
    assert load_settings(env={"GPUSHARE_SIM_ENABLED": raw}).sim.enabled is expected


def test_every_setting_is_documented_and_reachable_from_the_environment() -> None:
    fields = setting_fields()
    assert len(fields) > 10, "no settings found"
    names = [env_name(key) for key in fields]
    assert len(set(names)) == len(names), "two settings share an environment variable"
    for key, field in fields.items():
        assert field.metadata.get("doc"), f"{key} has no doc"
        default = getattr(getattr(Settings(), key.split(".")[0]), key.split(".")[1])
        raw = str(default).lower() if isinstance(default, bool) else str(default)
        loaded = load_settings(env={env_name(key): raw})
        assert loaded == Settings(), f"{env_name(key)} does not reach {key}"


def test_show_output_round_trips_through_the_loader() -> None:
    original = load_settings(FILE)
    text = yaml.safe_dump(settings_as_dict(original))
    assert load_settings(text) == original
    assert settings_as_dict(original)["version"] == CONFIG_VERSION


def test_settings_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().telemetry.window_s = 3  # type: ignore[misc]


def test_socket_path_defaults_under_the_runtime_dir() -> None:
    settings = load_settings(overrides={"paths.runtime_dir": "/r"})
    assert settings.unix_socket_path == "/r/agent.sock"
    settings = load_settings(overrides={"api.unix_socket": "/elsewhere.sock"})
    assert settings.unix_socket_path == "/elsewhere.sock"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('version: "1"\n', "version"),
        ("version: true\n", "version"),
        ("version: 1.0\n", "version"),
        ("version: 1\ntelemetry:\n  window_s: 5\ntelemetry:\n  stale_after_s: 9\n", "telemetry"),
        ("version: 1\nmps:\n  hung_after_probes: 1.5\n", "mps.hung_after_probes"),
        ("version: 1\ntelemetry:\n  window_s: " + "9" * 400 + "\n", "telemetry.window_s"),
        ("version: 1\ntelemetry:\n  stale_after_s: 1.5\n", "telemetry.stale_after_s"),
    ],
)
def test_strict_reading(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(text)
    assert info.value.key == key


def test_values_from_env_and_flags_are_stripped() -> None:
    settings = load_settings(
        env={"GPUSHARE_RUNTIME_LOG_LEVEL": " debug "}, overrides={"sim.enabled": " true "}
    )
    assert settings.runtime.log_level == "debug" and settings.sim.enabled
