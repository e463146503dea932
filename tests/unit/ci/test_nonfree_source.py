"""`.ci/nonfree_source.py` derives CI's non-free apt source from the machine's own sources,
and `.ci/run` names no archive host."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPT = REPO / ".ci" / "nonfree_source.py"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

DEB822 = f"""Types: deb
# a comment inside a stanza
URIs: http://mirror.example/debian
Suites: trixie trixie-updates
Components: main
Signed-By: {KEYRING}

Types: deb deb-src
URIs: http://mirror.example/debian-security
Suites: trixie-security
Components: main contrib
Signed-By: {KEYRING}

Types: deb-src
URIs: http://src-only.example/debian
Suites: trixie
Components: main

Types: deb
URIs: http://disabled.example/debian
Suites: trixie
Components: main
Enabled: no
"""
THIRD_PARTY = """Types: deb
URIs: https://vendor.example/apt
Suites: stable
Components: main
Signed-By: /usr/share/keyrings/vendor.gpg
"""
ONE_LINE = f"""# the classic format
deb [arch=amd64 signed-by={KEYRING}] http://mirror.example/debian bookworm main
deb http://old.example/debian bookworm-updates main contrib  # trailing comment
deb-src http://mirror.example/debian bookworm main
deb http://has-nonfree.example/debian bookworm main non-free
"""


def derive(apt_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(apt_dir)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def stanzas(text: str) -> list[dict[str, str]]:
    result = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        result.append(fields)
    return result


@pytest.fixture
def apt_dir(tmp_path: Path) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    return tmp_path


def test_deb822_sources_get_non_free_with_the_same_uris_and_suites(apt_dir: Path) -> None:
    (apt_dir / "sources.list.d" / "debian.sources").write_text(DEB822)
    (apt_dir / "sources.list.d" / "vendor.sources").write_text(THIRD_PARTY)
    (apt_dir / "sources.list.d" / "ignored.sources.disabled").write_text(DEB822)
    done = derive(apt_dir)
    assert done.returncode == 0, done.stderr
    assert stanzas(done.stdout) == [
        {
            "Types": "deb",
            "URIs": "http://mirror.example/debian",
            "Suites": "trixie trixie-updates",
            "Components": "non-free",
            "Signed-By": KEYRING,
        },
        {
            "Types": "deb",
            "URIs": "http://mirror.example/debian-security",
            "Suites": "trixie-security",
            "Components": "non-free",
            "Signed-By": KEYRING,
        },
    ]


def test_one_line_sources_are_read_with_their_options(apt_dir: Path) -> None:
    (apt_dir / "sources.list").write_text(ONE_LINE)
    done = derive(apt_dir)
    assert done.returncode == 0, done.stderr
    found = [(s["URIs"], s["Suites"], s["Components"]) for s in stanzas(done.stdout)]
    assert found == [
        ("http://mirror.example/debian", "bookworm", "non-free"),
        ("http://old.example/debian", "bookworm-updates", "non-free"),
    ]


def test_no_debian_source_is_an_error(apt_dir: Path) -> None:
    (apt_dir / "sources.list.d" / "vendor.sources").write_text(THIRD_PARTY)
    done = derive(apt_dir)
    assert done.returncode == 1 and done.stdout == ""
    assert "no Debian deb source" in done.stderr


def test_ci_names_no_archive_host() -> None:
    for path in (REPO / ".ci").iterdir():
        text = path.read_text()
        assert not re.search(r"[a-z]+://", text), f"{path.name} names a URL"
        assert "debian.org" not in text
    assert "nonfree_source.py /etc/apt" in (REPO / ".ci" / "run").read_text()
