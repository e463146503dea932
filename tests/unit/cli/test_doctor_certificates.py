"""`gpushare doctor`'s certificate checks: each expiry and error over facts, the dates read
from DER as openssl reads them (UTCTime and GeneralizedTime), and the facts gathered from
the configured files."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent import doctor as pf
from agent.config import load_settings
from agent.doctor import CertFacts, gather
from tests.certs import make_pki
from tests.unit.cli.test_doctor import line

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


# -- certificates ---------------------------------------------------------------------------


def valid(days_before: float, days_after: float) -> CertFacts:
    span = (NOW - timedelta(days=days_before), NOW + timedelta(days=days_after))
    return CertFacts("api.tls_cert_file", "/tls/tls.crt", validity=(span,))


@pytest.mark.parametrize(
    ("facts", "status", "found", "fix"),
    [
        (valid(10, 80), "ok", "valid until 2027-02-23 12:00 UTC (80 days)", ""),
        (valid(10, 13.5), "warn", "expires in 13.5 days", "renew /tls/tls.crt"),
        (valid(90, -1), "fail", "/tls/tls.crt expired on 2026-12-04 12:00 UTC", "renew"),
        (valid(-1, 90), "fail", "not valid before 2026-12-06", "clock"),
        (
            CertFacts(
                "api.tls_cert_file", "/tls/tls.crt", error="cannot read it: Permission denied"
            ),
            "fail",
            "/tls/tls.crt: cannot read it: Permission denied",
            "mount the Secret",
        ),
        (CertFacts("api.tls_cert_file", "/tls/x"), "fail", "holds no PEM certificate", "renew"),
        (CertFacts("api.tls_key_file", "/tls/tls.key", is_key=True), "ok", "is readable", ""),
    ],
)
def test_certificate(facts: CertFacts, status: str, found: str, fix: str) -> None:
    f = pf.check_cert(facts, NOW)
    assert (f.status, f.check) == (status, f"cert:{facts.key}")
    assert found in f.found and fix in f.fix


def test_a_chain_is_as_good_as_its_first_expiry() -> None:
    chain = CertFacts(
        "api.tls_cert_file",
        "/c",
        validity=(valid(1, 300).validity[0], valid(1, -2).validity[0]),
    )
    assert pf.check_cert(chain, NOW).status == "fail"


def test_no_certificates_configured_is_a_skip() -> None:
    [f] = pf.check_certs([], NOW, ("api.tls_cert_file",))
    assert line(f) == "skip  certificates  none configured (api.tls_cert_file)"


def openssl_ca(root: Path, name: str, start: str, end: str) -> Path:
    """A certificate of the test CA with the given dates (``openssl ca``)."""
    (root / "ca.cnf").write_text(
        "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\n"
        "serial = ca.srl\ndefault_md = sha256\npolicy = p\nunique_subject = no\n"
        "[p]\ncommonName = supplied\n"
    )
    (root / "index.txt").touch()
    subprocess.run(
        ["openssl", "ca", "-batch", "-config", "ca.cnf", "-cert", "ca.crt", "-keyfile",
         "ca.key", "-in", "server.csr", "-out", f"{name}.crt", "-startdate", start,
         "-enddate", end, "-notext"],
        cwd=root, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return root / f"{name}.crt"


def test_pem_dates_are_what_openssl_reads(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    [(before, after)] = pf.pem_validity(pki.server_cert.read_text())
    shown = subprocess.run(
        ["openssl", "x509", "-in", str(pki.server_cert), "-noout", "-enddate"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert shown == "notAfter=" + after.strftime("%b %e %H:%M:%S %Y GMT")
    assert timedelta(days=1.9) < after - before < timedelta(days=2.1)
    # UTCTime before 2050, GeneralizedTime after
    old = openssl_ca(tmp_path, "old", "20200101000000Z", "20200201000000Z")
    far = openssl_ca(tmp_path, "far", "20491231000000Z", "20600102030405Z")
    assert pf.pem_validity(old.read_text()) == [
        (datetime(2020, 1, 1, tzinfo=UTC), datetime(2020, 2, 1, tzinfo=UTC))
    ]
    assert pf.pem_validity(far.read_text()) == [
        (datetime(2049, 12, 31, tzinfo=UTC), datetime(2060, 1, 2, 3, 4, 5, tzinfo=UTC))
    ]
    both = pki.server_cert.read_text() + pki.ca.read_text()
    assert len(pf.pem_validity(both)) == 2


@pytest.mark.parametrize(
    "text",
    [
        "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        "-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n",
        "-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n",
    ],
)
def test_bad_certificates_are_refused(text: str) -> None:
    with pytest.raises(pf.CertificateError):
        pf.pem_validity(text)


def test_cert_facts_from_files(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n")
    settings = load_settings(
        overrides={
            "api.tls_cert_file": str(pki.server_cert),
            "api.tls_key_file": str(pki.server_key),
            "api.tls_client_ca_file": str(tmp_path / "missing.crt"),
            "dra.api_ca": str(garbage),
        }
    )
    facts = {f.key: f for f in gather.cert_facts(settings)}
    assert len(facts["api.tls_cert_file"].validity) == 1
    assert facts["api.tls_key_file"].is_key and not facts["api.tls_key_file"].error
    assert facts["api.tls_client_ca_file"].error == "cannot read it: No such file or directory"
    assert facts["dra.api_ca"].error.startswith("not a PEM certificate")
    # the certificates were made just now: judged at the real time, not the table's NOW
    statuses = {
        f.check: f.status for f in pf.check_certs(list(facts.values()), datetime.now(UTC), ())
    }
    assert statuses == {
        "cert:api.tls_cert_file": "warn",  # the test CA's certificates live 2 days
        "cert:api.tls_key_file": "ok",
        "cert:api.tls_client_ca_file": "fail",
        "cert:dra.api_ca": "fail",
    }
