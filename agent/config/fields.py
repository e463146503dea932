"""How a setting is declared: its default, what it means, and its bounds."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from agent.core.errors import ConfigError, GpushareError
from agent.core.units import parse_bytes


def setting(default: Any, doc: str, **rules: Any) -> Any:
    """A setting: its default, what it means (``doc``), and ``min``/``max``/``choices``.

    ``default_doc`` replaces the default in the reference where the default depends on the
    machine (paths by user, the host name).
    """
    return field(default=default, metadata={"doc": doc, **rules})


def setting_bytes(key: str, text: str) -> int:
    """A size setting (``10GiB``) in bytes; a ConfigError names ``key``."""
    try:
        return parse_bytes(text)
    except GpushareError as exc:
        raise ConfigError(key, str(exc)) from exc
