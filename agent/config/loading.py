"""Read settings: defaults < YAML file < ``GPUSHARE_*`` environment < flags.

Every error names the dotted key (``telemetry.sample_interval_s``) and raises
:class:`~agent.core.errors.ConfigError`. Unknown keys are errors, never ignored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import yaml

from agent.config import settings as defaults
from agent.config.settings import CONFIG_VERSION, Settings
from agent.core.errors import ConfigError

ENV_PREFIX = "GPUSHARE_"
# Variables the CLI reads for itself; they are not settings.
CLI_ENV_NAMES = frozenset({"GPUSHARE_CONFIG", "GPUSHARE_SOCKET"})


def _groups() -> dict[str, type[Any]]:
    """Setting groups by name: each ``Settings`` field's default factory is its class."""
    return {f.name: f.default_factory for f in dataclasses.fields(Settings)}  # type: ignore[misc]


def setting_fields() -> dict[str, dataclasses.Field[Any]]:
    """All settings as ``{"group.name": field}``, in declaration order."""
    result: dict[str, dataclasses.Field[Any]] = {}
    for group, cls in _groups().items():
        for f in dataclasses.fields(cls):
            result[f"{group}.{f.name}"] = f
    return result


def load_settings(
    file_text: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    source: str = "config file",
) -> Settings:
    """Build the effective settings from a YAML text, an environment and flag overrides."""
    values: dict[str, Any] = {}
    if file_text is not None:
        values.update(_read_file(file_text, source))
    values.update(_read_env(env or {}))
    for key, value in (overrides or {}).items():
        values[_known_key(key, "flag")] = value.strip() if isinstance(value, str) else value
    return _build(values)


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(str(key), f"appears twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_file(text: str, source: str) -> dict[str, Any]:
    try:
        document = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{source} is not valid YAML: {exc}") from exc
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError("", f"{source} must be a mapping of setting groups")
    version = document.pop("version", None)
    if type(version) is not int or version != CONFIG_VERSION:
        raise ConfigError(
            "version", f"must be the number {CONFIG_VERSION} (found {version!r}) in {source}"
        )
    values: dict[str, Any] = {}
    groups = _groups()
    for group, body in document.items():
        if group not in groups:
            raise ConfigError(str(group), f"unknown setting group (known: {', '.join(groups)})")
        if not isinstance(body, dict):
            raise ConfigError(str(group), "must be a mapping of settings")
        for name, value in body.items():
            values[_known_key(f"{group}.{name}", source)] = value
    return values


def _read_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    by_env_name = {env_name(key): key for key in setting_fields()}
    groups = _groups()
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name in CLI_ENV_NAMES:
            continue
        if name in by_env_name:
            values[by_env_name[name]] = value.strip()
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        if any(rest.startswith(f"{group}_") for group in groups):
            raise ConfigError(name, "unknown setting in the environment")
    return values


def env_name(key: str) -> str:
    """``telemetry.window_s`` -> ``GPUSHARE_TELEMETRY_WINDOW_S``."""
    return ENV_PREFIX + key.replace(".", "_").upper()


def _known_key(key: str, source: str) -> str:
    if key not in setting_fields():
        raise ConfigError(key, f"unknown setting (from {source})")
    return key


def _build(values: Mapping[str, Any]) -> Settings:
    fields = setting_fields()
    per_group: dict[str, dict[str, Any]] = {group: {} for group in _groups()}
    for key, raw in values.items():
        group, name = key.split(".", 1)
        per_group[group][name] = _coerce(key, raw, fields[key])
    settings = Settings(**{group: cls(**per_group[group]) for group, cls in _groups().items()})
    _check_consistency(settings)
    return settings


def _coerce(key: str, raw: Any, f: dataclasses.Field[Any]) -> Any:
    kind = type(f.default)
    value = _convert(key, raw, kind)
    choices = f.metadata.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(key, f"must be one of {', '.join(choices)} (got {value!r})")
    low, high = f.metadata.get("min"), f.metadata.get("max")
    if low is not None and value < low:
        raise ConfigError(key, f"must be at least {low} (got {value!r})")
    if high is not None and value > high:
        raise ConfigError(key, f"must be at most {high} (got {value!r})")
    return value


def _convert(key: str, raw: Any, kind: type) -> Any:
    if kind is bool:
        return _to_bool(key, raw)
    if kind in (int, float):
        return _to_number(key, raw, kind)
    if not isinstance(raw, str):
        raise ConfigError(key, f"must be a string (got {type(raw).__name__})")
    return raw


def _to_bool(key: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(raw, str) and raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(key, f"must be true or false (got {raw!r})")


def _to_number(key: str, raw: Any, kind: type) -> float | int:
    if isinstance(raw, bool):
        raise ConfigError(key, f"must be a number (got {raw!r})")
    try:
        value = float(raw) if isinstance(raw, (str, int, float)) else None
    except (ValueError, OverflowError):
        value = None
    if value is None or not math.isfinite(value):
        raise ConfigError(key, f"must be a finite {kind.__name__} (got {raw!r})")
    if kind is int:
        if value != int(value):
            raise ConfigError(key, f"must be a whole number (got {raw!r})")
        return int(value)
    return value


def _check_consistency(settings: Settings) -> None:
    t = settings.telemetry
    if t.window_s < t.sample_interval_s:
        raise ConfigError(
            "telemetry.window_s",
            f"must be at least telemetry.sample_interval_s ({t.sample_interval_s})",
        )
    if t.stale_after_s < 2 * t.sample_interval_s:
        raise ConfigError(
            "telemetry.stale_after_s",
            f"must be at least twice telemetry.sample_interval_s ({t.sample_interval_s}), "
            "or healthy devices would flap between fresh and stale",
        )


def settings_as_dict(settings: Settings) -> dict[str, Any]:
    """The effective settings as a plain, versioned mapping (what ``config show`` prints)."""
    return {"version": CONFIG_VERSION, **dataclasses.asdict(settings)}


SIM_SUFFIX = "-sim"


def simulation_paths(settings: Settings) -> Settings:
    """A simulated node never shares the production paths: with ``sim.enabled``, a runtime
    or state directory left at its default gets ``-sim`` appended (``/run/gpushare-sim``,
    ``/var/lib/gpushare-sim`` as root); paths set explicitly are kept."""
    if not settings.sim.enabled:
        return settings
    paths = settings.paths
    default_runtime, default_state = defaults.default_runtime_dir(), defaults.default_state_dir()
    runtime = paths.runtime_dir + SIM_SUFFIX if paths.runtime_dir == default_runtime else None
    state = paths.state_dir + SIM_SUFFIX if paths.state_dir == default_state else None
    return dataclasses.replace(
        settings,
        paths=dataclasses.replace(
            paths, runtime_dir=runtime or paths.runtime_dir, state_dir=state or paths.state_dir
        ),
    )
