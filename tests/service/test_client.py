"""The client (dpbudget.accountant.service.client) driving the real server under load: 8
concurrent clients racing one analyst's last budget never get more than it (SQLite and
PostgreSQL), and the server killed with SIGKILL mid-load loses no debit for an answer that was
sent: every receipt a client received names a record of the ledger, hash and all. Also the
table API's answer types come back as themselves (grouped keys, means as dicts). Over TLS
(``serve --cert --key``), a client that trusts the service's self-signed certificate
(``connect(..., cafile=)``) is answered; one that does not is refused by certificate
verification, and nothing is spent."""

from __future__ import annotations

import concurrent.futures
import datetime
import ipaddress
import signal
import ssl
import threading
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from dpbudget.accountant.ledger import open_ledger
from dpbudget.accountant.service.client import connect
from dpbudget.accountant.values.errors import (BudgetExceededError, LedgerUnconfirmedError,
                                               PrivacyError)
from tests.service._site import head, make_site, server

pytestmark = pytest.mark.slow


def _race(url: str, token: str) -> list[Any]:
    """8 clients at once, each asking ε = 0.1 of alice's quota of 0.3: the answers received."""
    start = threading.Barrier(8)

    def one(_: int) -> Any:
        table = connect(url, token=token).table("visits")
        start.wait()
        try:
            return table.count(epsilon=0.1).release()
        except BudgetExceededError:
            return None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return [a for a in pool.map(one, range(8)) if a is not None]


def test_eight_clients_racing_alices_last_budget_sqlite(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    with server(site) as (url, _):
        answers = _race(url, site.tokens["alice"])
        remaining = connect(url, token=site.tokens["alice"]).remaining("visits")
    assert len(answers) == 3  # 3 × 0.1 fit in 0.3, never a 4th
    assert remaining["analyst"]["epsilon"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.postgres
def test_eight_clients_racing_the_last_budget_postgres(tmp_path: Path,
                                                       postgres_database: str) -> None:
    """On PostgreSQL the analyst is the role the server's session logged in as (here
    ``dpbudget``): the token is that role's, and its quota holds across the race."""
    from tests.conftest import _fresh_schema

    site = make_site(tmp_path, _fresh_schema(postgres_database), alice="dpbudget")
    with server(site) as (url, _):
        answers = _race(url, site.tokens["dpbudget"])
    assert len(answers) == 3
    with open_ledger(site.ledger, create=False) as ledger:
        released = [e for e in ledger.entries() if '"kind":"release"' in e.text]
    assert len(released) == 3


def test_sigkill_mid_load_loses_no_debit_for_an_answer_sent(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    receipts: list[dict[str, Any]] = []
    lock, stop = threading.Lock(), threading.Event()
    with server(site) as (url, proc):
        def load() -> None:
            service = connect(url, token=site.tokens["bob"], timeout=20)
            while not stop.is_set():
                try:
                    service.table("visits").count(epsilon=0.001).release()
                except (PrivacyError, OSError):
                    return  # (the server is gone)
                with lock:
                    receipts.append(dict(service.last_receipt or {}))

        workers = [threading.Thread(target=load) for _ in range(8)]
        for w in workers:
            w.start()
        while len(receipts) < 40:  # mid-load: answers are flowing
            stop.wait(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(20)
        stop.set()
        for w in workers:
            w.join(30)
    assert len(receipts) >= 40
    with open_ledger(site.ledger, create=False) as ledger:
        for receipt in receipts:
            entry = ledger.entry(receipt["seq"])
            assert entry is not None and entry.hash == receipt["hash"]


def test_answer_types_come_back_as_themselves(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    with server(site) as (url, _):
        visits = connect(url, token=site.tokens["bob"]).table("visits")
        grouped = visits.group_by("city", keys=["a", "b"]).mean(
            "amount", lower=0.0, upper=100.0, epsilon=0.5).release()
        assert set(grouped) == {"a", "b"} and set(grouped["a"]) == {"mean", "count", "sum"}
        median = visits.filter("city", "in", ["a", "c"]).median(
            "amount", lower=0, upper=100, bins=100, epsilon=0.5).release()
        assert isinstance(median, float) and 0.0 <= median <= 100.0
        accuracy = visits.count(epsilon=0.5).accuracy()
        assert accuracy["rows"]["scale"] > 0


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key: (certificate, key) PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dpbudget test")])
    start = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)  # (no clock read)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + datetime.timedelta(days=365 * 80))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_the_client_trusts_the_services_certificate_only_when_given_it(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    cert, key = _self_signed(tmp_path)
    with server(site, "--cert", str(cert), "--key", str(key)) as (url, _):
        url = url.replace("http://", "https://", 1)
        answer = connect(url, token=site.tokens["bob"], cafile=str(cert)).table(
            "visits").count(epsilon=0.1).release()
        assert abs(answer - 3000) < 3000  # (ε = 0.1 on 3,000 rows: noise scale 100)
        before = head(site.ledger)
        # the control: the system's trust store does not hold the certificate: refused
        with pytest.raises(urllib.error.URLError) as caught:
            connect(url, token=site.tokens["bob"]).table("visits").count(epsilon=0.1).release()
        assert isinstance(caught.value.reason, ssl.SSLCertVerificationError)
        assert head(site.ledger) == before
        with pytest.raises((LedgerUnconfirmedError, OSError)):  # plain HTTP to TLS: cut off
            connect(url.replace("https://", "http://"), token=site.tokens["bob"]).table(
                "visits").count(epsilon=0.1).release()
        assert head(site.ledger) == before


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"ok\"",
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\n{\"ok\"",
    b""], ids=["cut off", "not whole JSON", "no reply"])
def test_a_reply_cut_off_says_the_query_may_be_spent(reply: bytes) -> None:
    """A server that dies while answering (the SIGKILL test's race): the client says the query
    may have been debited (LedgerUnconfirmedError: do not retry blindly), never a raw
    http.client or JSON error. A one-shot socket server stands in for the dying service."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            got = b""
            while b"\r\n\r\n" not in got:  # (the whole request, so the reply is what is cut)
                got += conn.recv(65536)
            head, _, body = got.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(reply)
        listener.close()

    threading.Thread(target=answer, daemon=True).start()
    with pytest.raises(LedgerUnconfirmedError, match="may have been debited"):
        connect(f"http://127.0.0.1:{port}", token="dpb_" + "0" * 16 + "_x",
                timeout=20).table("visits").count(epsilon=0.1).release()
