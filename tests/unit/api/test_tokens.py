"""The token file is handled like a secret: mode, owner, placeholders, entropy."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
import yaml

from agent.api.tokens import TokenHolder, entropy_bits, read_token
from agent.core.errors import ConfigError
from tests.helpers import REPO

GOOD_HEX = secrets.token_hex(16)  # 32 hex digits: exactly 128 bits


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("token", "bits"),
    [
        ("ab" * 16, 128.0),  # hex: 4 bits a character
        ("Zm9v" * 8, 192.0),  # base64: 6 bits
        ("a-_b" * 8, 192.0),  # base64url: 6 bits
        ("a!b~" * 5, 20 * 6.569855608330948),  # printable ASCII: log2(95)
    ],
)
def test_entropy_is_length_times_log2_of_the_alphabet(token: str, bits: float) -> None:
    assert entropy_bits(token) == pytest.approx(bits)


def test_a_good_token_is_read_without_its_newline(tmp_path: Path) -> None:
    assert read_token(str(token_file(tmp_path, GOOD_HEX + "\n"))) == GOOD_HEX
    assert read_token(str(token_file(tmp_path, GOOD_HEX, 0o400))) == GOOD_HEX


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o666, 0o620, 0o602])
def test_a_token_file_open_to_group_or_others_is_refused_with_its_mode(
    tmp_path: Path, mode: int
) -> None:
    path = token_file(tmp_path, GOOD_HEX, mode)
    with pytest.raises(ConfigError) as info:
        read_token(str(path))
    assert info.value.key == "api.token_file"
    assert str(path) in str(info.value) and f"{mode:04o}" in str(info.value)
    assert GOOD_HEX not in str(info.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_token_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = token_file(tmp_path, GOOD_HEX)
    os.chown(path, 65534, -1)
    with pytest.raises(ConfigError, match=r"owned by uid 65534"):
        read_token(str(path))


@pytest.mark.parametrize(
    ("token", "rule"),
    [
        ("REPLACE-WITH-A-LONG-RANDOM-TOKEN", "placeholder"),  # daemonset/secret.yaml's
        ("changeme", "placeholder"),
        ("replace-me", "placeholder"),
        ("ChangeMe", "placeholder"),
        (GOOD_HEX[:-1], "entropy"),  # 31 hex digits: 124 bits
        ("s3cret-token-for-test", "entropy"),  # 21 base64url characters: 126 bits
        ("a" * 16, "entropy"),  # hex alphabet, 64 bits
        ("correct horse battery staple", "printable"),
    ],
)
def test_weak_tokens_are_refused_naming_the_rule(tmp_path: Path, token: str, rule: str) -> None:
    with pytest.raises(ConfigError, match=rf"rule: {rule}"):
        read_token(str(token_file(tmp_path, token)))


def test_the_shipped_placeholder_is_refused(tmp_path: Path) -> None:
    secret = yaml.safe_load((REPO / "daemonset" / "secret.yaml").read_text())
    placeholder = secret["stringData"]["token"]
    with pytest.raises(ConfigError, match="placeholder"):
        read_token(str(token_file(tmp_path, placeholder)))


def test_a_missing_or_empty_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_token(str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="empty"):
        read_token(str(token_file(tmp_path, "\n")))


def test_the_holder_swaps_on_reload_and_keeps_the_old_token_on_a_bad_file(
    tmp_path: Path,
) -> None:
    path = token_file(tmp_path, GOOD_HEX)
    holder = TokenHolder(str(path))
    assert holder.expected == f"Bearer {GOOD_HEX}".encode()
    new = secrets.token_hex(20)
    token_file(tmp_path, new)
    holder.reload()
    assert holder.expected == f"Bearer {new}".encode()
    path.chmod(0o644)
    with pytest.raises(ConfigError):
        holder.reload()
    assert holder.expected == f"Bearer {new}".encode()


def test_named_tokens_and_rotation(tmp_path: Path) -> None:
    old, new, other = secrets.token_hex(32), secrets.token_hex(32), secrets.token_hex(32)
    path = token_file(tmp_path, f"# callers\nsched {old}\nsched {new}  # rotating\nci {other}\n")
    holder = TokenHolder(str(path))
    assert holder.match(f"Bearer {old}".encode()) == "sched"
    assert holder.match(f"Bearer {new}".encode()) == "sched"
    assert holder.match(f"Bearer {other}".encode()) == "ci"
    assert holder.match(f"Bearer {old[:-1]}".encode()) is None
    assert holder.match(b"") is None


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("sched {a}\nci {a}\n", "one token comes twice"),
        ("sched {a} extra\nci {b}\n", "line 1: expected NAME TOKEN"),
        ("sched\n{a}\n", "line 1: expected NAME TOKEN"),
        ("sched {a}\nci deadbeef\n", "line 2: the token has about 32 bits"),
    ],
)
def test_bad_named_token_files_say_which_line_and_rule(
    tmp_path: Path, text: str, rule: str
) -> None:
    path = token_file(tmp_path, text.format(a=secrets.token_hex(32), b=secrets.token_hex(32)))
    with pytest.raises(ConfigError, match=rule):
        TokenHolder(str(path))
