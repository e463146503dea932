"""The configuration reference (``docs/configuration.md``), generated from the settings.

    python -m agent.config.reference > docs/configuration.md

A test fails when the checked-in file differs from what this prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.config.loading import env_name, setting_fields
from agent.config.settings import CONFIG_VERSION

HEADER = f"""# Configuration reference

Generated from the settings dataclasses by `python -m agent.config.reference`; do not edit.

Sources, later ones winning: built-in defaults, the YAML file (`--config FILE`, else
`/etc/gpushare/config.yaml` if present), `GPUSHARE_*` environment variables, then flags
(`--set KEY=VALUE` and the named flags of `gpushare serve`). The file must start with
`version: {CONFIG_VERSION}`; unknown keys and bad values stop start-up with exit code 2 and
a message naming the key. `gpushare config show` prints the effective result.

```yaml
version: {CONFIG_VERSION}
telemetry:
  sample_interval_s: 1.0
  window_s: 10.0
```
"""


def render() -> str:
    lines = [HEADER]
    group = ""
    for key, f in setting_fields().items():
        this_group = key.split(".", 1)[0]
        if this_group != group:
            group = this_group
            lines.append(f"\n## `{group}`\n")
            lines.append("| key | environment | default | meaning |")
            lines.append("|---|---|---|---|")
        default = f.metadata.get("default_doc") or repr(f.default)
        rules = _rules(f.metadata)
        lines.append(f"| `{key}` | `{env_name(key)}` | {default} | {f.metadata['doc']}{rules} |")
    return "\n".join(lines) + "\n"


def _rules(metadata: Mapping[str, Any]) -> str:
    parts = []
    if (choices := metadata.get("choices")) is not None:
        parts.append("one of " + ", ".join(f"`{c}`" for c in choices))
    if (low := metadata.get("min")) is not None:
        parts.append(f"at least {low}")
    if (high := metadata.get("max")) is not None:
        parts.append(f"at most {high}")
    return f" ({'; '.join(parts)})" if parts else ""


if __name__ == "__main__":
    print(render(), end="")
