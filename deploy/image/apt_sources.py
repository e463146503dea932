#!/usr/bin/env python3
"""Print the deb822 apt sources the image's base is built from: this machine's own Debian
sources (the same URIs and suites as its configured ``deb`` entries, read the way
``.ci/nonfree_source.py`` reads them) with the components ``main non-free``, so that the
build never names an archive host itself and finds non-free ``nvidia-cuda-mps``.

Usage: apt_sources.py [APT_DIR]   (default /etc/apt); exits 1 if it finds no source.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _reader() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "nonfree_source", REPO / ".ci" / "nonfree_source.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sources(apt_dir: Path) -> str:
    reader = _reader()
    stanzas = []
    seen = set()
    for entry in filter(reader.is_debian, reader.configured(apt_dir)):
        for suite in entry.get("suites", "").split():
            key = (entry.get("uris", "").split()[0] if entry.get("uris") else "", suite)
            if not all(key) or key in seen:
                continue
            seen.add(key)
            stanzas.append(
                f"Types: deb\nURIs: {key[0]}\nSuites: {suite}\nComponents: main non-free\n"
                f"Signed-By: {entry.get('signed-by') or reader.DEBIAN_KEYRING}\n"
            )
    return "\n".join(stanzas)


def main(argv: list[str]) -> int:
    apt_dir = Path(argv[1] if len(argv) > 1 else "/etc/apt")
    text = sources(apt_dir)
    if not text:
        print(f"no Debian deb source under {apt_dir}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
