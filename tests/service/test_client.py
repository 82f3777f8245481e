"""The client (dpbudget.accountant.service.client) driving the real server under load: 8
concurrent clients racing one analyst's last budget never get more than it (SQLite and
PostgreSQL), and the server killed with SIGKILL mid-load loses no debit for an answer that was
sent: every receipt a client received names a record of the ledger, hash and all. Also the
table API's answer types come back as themselves (grouped keys, means as dicts)."""

from __future__ import annotations

import concurrent.futures
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from dpbudget.accountant.ledger import open_ledger
from dpbudget.accountant.service.client import connect
from dpbudget.accountant.values.errors import BudgetExceededError, PrivacyError
from tests.service._site import make_site, server

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
