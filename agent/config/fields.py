"""How a setting is declared: its default, what it means, and its bounds."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def setting(default: Any, doc: str, **rules: Any) -> Any:
    """A setting: its default, what it means (``doc``), and ``min``/``max``/``choices``.

    ``default_doc`` replaces the default in the reference where the default depends on the
    machine (paths by user, the host name).
    """
    return field(default=default, metadata={"doc": doc, **rules})
