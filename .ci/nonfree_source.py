#!/usr/bin/env python3
"""Print a deb822 apt source that adds the ``non-free`` component to this machine's own
Debian sources: the same URIs and suites as its configured ``deb`` entries (deb822
``sources.list.d/*.sources`` and one-line ``sources.list``/``sources.list.d/*.list``),
so CI never names an archive host itself.

Usage: nonfree_source.py [APT_DIR]   (default /etc/apt); exits 1 if it finds no source.
Only Debian archive entries count: those signed by the Debian archive keyring, or with no
Signed-By (then the keyring is implied). Disabled stanzas and deb-src are skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def deb822_stanzas(text: str) -> list[dict[str, str]]:
    """Each stanza as field -> value (continuation lines joined; comments dropped)."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                stanzas.append(current)
            current, last = {}, ""
            continue
        if line[0] in " \t" and last:
            current[last] += " " + line.strip()
            continue
        key, sep, value = line.partition(":")
        if sep:
            last = key.strip().lower()
            current[last] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas


def one_line_entries(text: str) -> list[dict[str, str]]:
    """``deb [options] URI suite component...`` lines as deb822-like fields."""
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        options = ""
        rest = rest.strip()
        if rest.startswith("["):
            options, _, rest = rest[1:].partition("]")
        words = rest.split()
        if len(words) < 3:
            continue
        fields = {"types": kind, "uris": words[0], "suites": words[1]}
        fields["components"] = " ".join(words[2:])
        for option in options.split():
            name, _, value = option.partition("=")
            if name == "signed-by":
                fields["signed-by"] = value
        entries.append(fields)
    return entries


def configured(apt_dir: Path) -> list[dict[str, str]]:
    entries: list[dict[str, str]] = []
    listed = apt_dir / "sources.list"
    if listed.is_file():
        entries += one_line_entries(listed.read_text())
    parts = apt_dir / "sources.list.d"
    for path in sorted(parts.glob("*.list")) if parts.is_dir() else []:
        entries += one_line_entries(path.read_text())
    for path in sorted(parts.glob("*.sources")) if parts.is_dir() else []:
        entries += deb822_stanzas(path.read_text())
    return entries


def is_debian(entry: dict[str, str]) -> bool:
    if "deb" not in entry.get("types", "").split():
        return False
    if entry.get("enabled", "yes").lower() == "no":
        return False
    signed = entry.get("signed-by", "")
    return not signed or signed == DEBIAN_KEYRING


def nonfree_source(entries: list[dict[str, str]]) -> str:
    """One stanza per (URIs, Suites) not already carrying non-free."""
    stanzas = []
    seen = set()
    for entry in filter(is_debian, entries):
        if "non-free" in entry.get("components", "").split():
            continue
        key = (entry.get("uris", ""), entry.get("suites", ""))
        if not all(key) or key in seen:
            continue
        seen.add(key)
        stanzas.append(
            f"Types: deb\nURIs: {key[0]}\nSuites: {key[1]}\nComponents: non-free\n"
            f"Signed-By: {entry.get('signed-by') or DEBIAN_KEYRING}\n"
        )
    return "\n".join(stanzas)


def main(argv: list[str]) -> int:
    apt_dir = Path(argv[1] if len(argv) > 1 else "/etc/apt")
    text = nonfree_source(configured(apt_dir))
    if not text:
        print(f"no Debian deb source under {apt_dir} to add non-free to", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
