"""``gpushare doctor``'s certificate checks, and the validity dates of PEM certificates read
from their DER encoding (RFC 5280 ``tbsCertificate.validity``): the project has no X.509
library, and these two dates are all the checks need. Pure."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from datetime import UTC, datetime

from agent.doctor.facts import CertFacts, Finding

CERT_WARN_DAYS = 14


def check_cert(facts: CertFacts, now: datetime) -> Finding:
    """Unreadable or expired: fail; under CERT_WARN_DAYS left: warn."""
    name = f"cert:{facts.key}"
    renew = (
        f"renew {facts.path} (cert-manager: `kubectl describe certificate` says why it was "
        "not renewed); the agent re-reads it when it changes"
    )
    if facts.error:
        return Finding(
            "fail",
            name,
            f"{facts.path}: {facts.error}",
            "mount the Secret that holds it, readable by the agent's user, or fix the setting",
        )
    if facts.is_key:
        return Finding("ok", name, f"{facts.path} is readable")
    if not facts.validity:
        return Finding("fail", name, f"{facts.path} holds no PEM certificate", renew)
    not_before = max(v[0] for v in facts.validity)
    not_after = min(v[1] for v in facts.validity)
    day = not_after.strftime("%Y-%m-%d %H:%M UTC")
    if not_after <= now:
        return Finding("fail", name, f"{facts.path} expired on {day}", renew)
    if not_before > now:
        start = not_before.strftime("%Y-%m-%d %H:%M UTC")
        return Finding(
            "fail", name, f"{facts.path} is not valid before {start}", "check the node's clock"
        )
    left = (not_after - now).total_seconds() / 86400
    if left < CERT_WARN_DAYS:
        return Finding("warn", name, f"{facts.path} expires in {left:.1f} days ({day})", renew)
    return Finding("ok", name, f"{facts.path} valid until {day} ({left:.0f} days)")


def check_certs(certs: Sequence[CertFacts], now: datetime, keys: Sequence[str]) -> list[Finding]:
    if not certs:
        return [Finding("skip", "certificates", f"none configured ({', '.join(keys)})")]
    return [check_cert(c, now) for c in certs]


PEM_CERTIFICATE = re.compile(
    r"-----BEGIN CERTIFICATE-----\s*(.*?)\s*-----END CERTIFICATE-----", re.DOTALL
)


class CertificateError(ValueError):
    """Not a certificate this parser can read."""


def pem_validity(text: str) -> list[tuple[datetime, datetime]]:
    """(not_before, not_after) of every certificate in a PEM text, in order."""
    found = []
    for block in PEM_CERTIFICATE.findall(text):
        try:
            der = base64.b64decode("".join(block.split()), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise CertificateError(f"bad base64 in a certificate: {exc}") from exc
        found.append(der_validity(der))
    return found


def _tlv(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, content start, content end) of the DER element at ``at``."""
    if at + 2 > len(data):
        raise CertificateError("truncated DER")
    tag, length = data[at], data[at + 1]
    start = at + 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or start + count > len(data):
            raise CertificateError("bad DER length")
        length = int.from_bytes(data[start : start + count], "big")
        start += count
    if start + length > len(data):
        raise CertificateError("truncated DER")
    return tag, start, start + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    items = []
    while start < end:
        item = _tlv(data, start)
        items.append(item)
        start = item[2]
    return items


SEQUENCE, UTC_TIME, GENERALIZED_TIME, EXPLICIT_VERSION = 0x30, 0x17, 0x18, 0xA0


def _time(tag: int, raw: bytes) -> datetime:
    text = raw.decode("ascii")
    if tag == UTC_TIME and len(text) == 13 and text.endswith("Z"):
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != GENERALIZED_TIME or len(text) != 15 or not text.endswith("Z"):
        raise CertificateError(f"unsupported time {text!r}")
    return datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC)


def der_validity(der: bytes) -> tuple[datetime, datetime]:
    """(notBefore, notAfter) of a DER X.509 certificate."""
    try:
        tag, start, end = _tlv(der, 0)
        if tag != SEQUENCE:
            raise CertificateError("not a certificate")
        tag, start, end = _children(der, start, end)[0]
        fields = _children(der, start, end)
        if fields and fields[0][0] == EXPLICIT_VERSION:
            fields = fields[1:]
        # serialNumber, signature, issuer, validity
        tag, start, end = fields[3]
        times = _children(der, start, end)
        if tag != SEQUENCE or len(times) != 2:
            raise CertificateError("no validity")
        (t0, s0, e0), (t1, s1, e1) = times
        return _time(t0, der[s0:e0]), _time(t1, der[s1:e1])
    except CertificateError:
        raise
    except (IndexError, ValueError) as exc:
        raise CertificateError(f"not a certificate: {exc}") from exc
