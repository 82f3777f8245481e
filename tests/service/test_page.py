"""The owner's status page (``dpbudget.accountant.service.page``), loaded in a real headless
browser from the REAL service (``dpbudget serve`` in a subprocess) through the owner's one-time
signed link: the DOM Chromium built from it carries each account's spend and remaining budget as
the accountant reports them, hostile names as text (and no script runs); the screenshot shows a
drawn page. The negative controls, the tampered ledger's failed chain check and the ledger's own
time are checked on the renderer served plainly (a test server cannot set the service's clock,
and the service refuses to open a tampered ledger's copy)."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dpbudget.accountant import Accountant
from dpbudget.accountant.audit.findings import EXIT_BITS
from dpbudget.accountant.ledger import open_ledger
from dpbudget.accountant.service import page
from dpbudget.accountant.values.errors import BudgetExceededError
from dpbudget.mechanisms import Laplace
from tests import _browser
from tests.support import set_ledger_clock

T0 = 1_795_255_200.0  # 2026-11-21T10:00:00Z: the ledger's clock, never the wall's
POLICY = """
[datasets.adult]
limit = { epsilon = 2.0 }
[datasets.adult.analysts.alice]
limit = { epsilon = 0.5 }
[datasets.adult.analysts.bob]
limit = { epsilon = 1.0 }
[datasets.events]
limit = { epsilon = 3.0 }
[datasets.events.blocks]
by = "day"
first = "2026-11-15"
limit = { epsilon = 1.0 }
[analysts.bob]
limit = { epsilon = 1.5 }
"""
TITLE = "dpbudget: privacy budget status"
# Each would set the title if it ran; accepted by the gate as an analyst name and as a label.
HOSTILE_ANALYST = '"><img src=x onerror="document.title=\'pwned\'">'
HOSTILE_LABEL = "<script>document.title='pwned'</script>"


class Dom(HTMLParser):
    """What the test reads from the DOM the browser serialised: the title, every element with
    its attributes, the text under each id, and each budget row's cells by class."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.title, self.elements = "", []  # type: list[tuple[str, dict[str, Any]]]
        self.text: dict[str, str] = {}
        self.rows: dict[str, dict[str, str]] = {}
        self.heads: list[str] = []  # the row headers (a name per row)
        self._open: list[tuple[str, dict[str, Any]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.elements.append((tag, a))
        if tag not in ("img", "meta", "br"):
            self._open.append((tag, a))
        if tag == "tr" and ("data-account" in a or "data-bit" in a):
            self.rows[str(a.get("data-account") or a["data-bit"])] = {}

    def handle_endtag(self, tag: str) -> None:
        while self._open and self._open.pop()[0] != tag:
            pass

    def handle_data(self, data: str) -> None:
        for tag, a in self._open:
            if "id" in a:
                self.text[a["id"]] = self.text.get(a["id"], "") + data
        tag, a = self._open[-1] if self._open else ("", {})
        if tag == "title":
            self.title += data
        if tag == "th" and a.get("scope") == "row":
            self.heads.append(data)
        row = next((r.get("data-account") or r.get("data-bit") for t, r in reversed(self._open)
                    if t == "tr"), None)
        if row is not None and tag == "td" and a.get("class"):
            self.rows[row][a["class"].split()[0]] = data


@contextlib.contextmanager
def served(html: str) -> Iterator[str]:
    """``html`` served at /owner/status on a loopback port, in a thread, for one test."""
    body = html.encode("utf-8")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            self.send_response(200 if self.path == "/owner/status" else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/owner/status"
    finally:
        server.shutdown()
        server.server_close()


def browse(html: str) -> Dom:
    _browser.chromium()  # (skips before anything is served when there is no browser)
    with served(html) as url:
        return Dom(_browser.dump_dom(url))


@pytest.fixture
def service(acc: Accountant, tmp_path: Path) -> Iterator[Any]:
    """The real service on ``acc``'s ledger: a function giving a fresh one-time link to its
    status page (``Owner.status_link``, as ``dpbudget owner link`` prints it)."""
    from dpbudget.accountant.service.client import Owner
    from tests.service._site import Site, server

    _browser.chromium()  # (skips before the server starts when there is no browser)
    (tmp_path / "adult.csv").write_text("pid,x\n1,2\n")
    (tmp_path / "data.toml").write_text('[tables.adult]\ndataset = "adult"\n'
                                        'source = "adult.csv"\n')
    first = acc.ledger.entry(1)
    assert first is not None
    site = Site(tmp_path, acc.ledger.url, tmp_path / "owner.pem", {}, first.hash)
    with server(site) as (url, _):
        yield lambda: Owner(url, site.key, ledger=site.identity).status_link()


@pytest.fixture
def acc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Accountant]:
    """A SQLite ledger under a policy of two datasets (one divided into blocks), two analysts:
    four releases and a refusal, at T0 by the ledger's clock."""
    from dpbudget.accountant.gate.owner_key import new_key_file

    set_ledger_clock(lambda: T0, monkeypatch)
    (tmp_path / "policy.toml").write_text(POLICY, encoding="utf-8")
    new_key_file(tmp_path / "owner.pem")  # (the service serves only a ledger with an owner)
    with Accountant.from_policy(tmp_path / "policy.toml", ledger=tmp_path / "l.db",
                                owner_key=tmp_path / "owner.pem") as a:
        a.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
        a.release(Laplace(0.4, sensitivity=1.0), 1.0, dataset="adult", analyst="bob",
                  label=HOSTILE_LABEL)
        a.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="events", analyst="alice",
                  blocks=["2026-11-20", "2026-11-21"])
        a.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="events",
                  analyst=HOSTILE_ANALYST, blocks="2026-11-21")
        head = a.ledger.head()
        with pytest.raises(BudgetExceededError):  # alice has 0.2 left on adult
            a.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
        assert a.ledger.head() == head  # the refusal wrote nothing
        yield a


def _expected(acc: Accountant, key: str) -> tuple[float, float]:
    """(spent ε, remaining ε) of account ``key`` as the accountant itself reports them."""
    dataset, _, rest = key[len("dataset:"):].partition("/")
    kind, _, name = rest.partition(":")
    kw = {"analyst": name} if kind == "analyst" else {"block": name} if kind == "block" else {}
    return acc.spent(dataset, **kw).epsilon, acc.remaining(dataset, **kw).epsilon


def test_the_browser_shows_each_accounts_spend_and_remaining_as_the_accountant(
        acc, service) -> None:
    dom = Dom(_browser.dump_dom(service()))
    accounts = {k: v for k, v in dom.rows.items() if ":" in k}  # (not the exit bits' rows)
    assert set(accounts) == {"analyst:bob", "dataset:adult", "dataset:adult/analyst:alice",
                             "dataset:adult/analyst:bob", "dataset:events",
                             "dataset:events/block:2026-11-20", "dataset:events/block:2026-11-21"}
    for key, cells in accounts.items():
        spent, remaining = (0.4, 1.1) if key == "analyst:bob" else _expected(acc, key)
        assert float(cells["spent-e"]) == pytest.approx(spent, rel=1e-5), key
        assert float(cells["remaining-e"]) == pytest.approx(remaining, rel=1e-5), key
        assert float(cells["limit-e"]) == pytest.approx(spent + remaining, rel=1e-5), key
    # Each kind of limit in its own table, a bar with its share in words on each row.
    for table in ("datasets", "analysts", "blocks"):
        assert any(a.get("id") == table for t, a in dom.elements if t == "table")
    assert sum(1 for t, a in dom.elements if a.get("role") == "img") == len(accounts)
    assert [dom.rows[str(bit)]["found"] for bit, _, _ in page.BITS] == ["no"] * 7
    assert "Spend per block" in dom.text["blocks"]
    # The refused release (alice's 0.3) is in none of it: she spent 0.3 of 0.5 on adult.
    assert accounts["dataset:adult/analyst:alice"]["spent-e"] == "0.3"
    # The head, the clean audit and the time are the ledger's.
    seq, digest = acc.ledger.head()
    assert (dom.text["head-seq"], dom.text["head-hash"]) == (str(seq), digest)
    assert "Chain check passed" in dom.text["chain"] and "exit status 0" in dom.text["verdict"]
    # The time is the ledger's: T0 by its clock, which only the renderer in this process has.
    assert Dom(page.render(acc.ledger)).text["rendered"] == "2026-11-21T10:00:00+00:00"


def test_the_page_is_accessible_and_self_contained(acc) -> None:
    html = page.render(acc.ledger)
    dom = Dom(html)
    assert ("html", {"lang": "en"}) in dom.elements and dom.title == TITLE
    assert all(a.get("scope") in ("col", "row") for t, a in dom.elements if t == "th")
    assert all(a.get("alt") for t, a in dom.elements if t == "img")
    # Nothing fetched: every image is a data: URI, no script, no link, no external source.
    assert [t for t, a in dom.elements if t in ("script", "link", "iframe", "object")] == []
    assert all(a["src"].startswith("data:image/png;base64,") for t, a in dom.elements
               if t == "img")
    assert not any(k.startswith("on") for _, a in dom.elements for k in a)
    # No colour-only meaning: the bar's share is in words beside it and in its label.
    bars = [a["aria-label"] for t, a in dom.elements if a.get("role") == "img"]
    assert "60% of the ε limit spent" in bars  # alice on adult: 0.3 of 0.5


def test_hostile_names_appear_as_text_and_no_script_runs(service) -> None:
    """The attack: an analyst name and a label made of markup that would retitle the page."""
    dom = Dom(_browser.dump_dom(service()))
    assert dom.title == TITLE
    assert HOSTILE_ANALYST in dom.heads and HOSTILE_LABEL in dom.heads  # shown, as text
    assert not [t for t, a in dom.elements if t == "script" or "onerror" in a]


def test_negative_control_unescaped_names_build_elements_and_without_the_csp_run(
        acc, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the escaping, the browser builds the hostile elements (the check above sees
    them); the page's own Content-Security-Policy still stops them; without both, the script
    runs and retitles the page (so the title check above can fail)."""
    monkeypatch.setattr(page, "_text", str)
    dom = browse(page.render(acc.ledger))
    assert [t for t, a in dom.elements if t == "script" or "onerror" in a]
    assert dom.title == TITLE  # the CSP held
    monkeypatch.setattr(page, "CSP", "default-src * 'unsafe-inline'")
    assert browse(page.render(acc.ledger)).title == "pwned"


def _flip(db: Path, old: bytes, new: bytes) -> None:
    raw = db.read_bytes()
    assert raw.count(old) == 1 and len(old) == len(new)
    db.write_bytes(raw.replace(old, new))


def test_a_tampered_ledger_shows_the_failed_chain_check(acc, tmp_path: Path) -> None:
    """A byte of a record flipped in a copy of the file (bob's ε 0.4 made 0.1): the page of the
    copy says the chain check failed and shows bit 8; the page of the original does not."""
    source = Path(acc.ledger.url.removeprefix("sqlite:///"))
    acc.close()
    good, bad = tmp_path / "good.db", tmp_path / "bad.db"
    shutil.copyfile(source, good)
    shutil.copyfile(source, bad)
    with contextlib.closing(sqlite3.connect(bad)) as db:
        record = db.execute("SELECT record FROM entries WHERE record LIKE '%\"analyst\":\"bob\"%'"
                            ).fetchone()[0].encode("utf-8")
    assert b'"epsilon":0.4' in record
    _flip(bad, record, record.replace(b'"epsilon":0.4', b'"epsilon":0.1'))
    pages = {}
    for name, path in (("good", good), ("bad", bad)):
        with open_ledger(path, create=False) as ledger:
            pages[name] = page.render(ledger)
    for name, failed in (("good", False), ("bad", True)):
        dom = browse(pages[name])
        assert ("Chain check FAILED" in dom.text["chain"]) is failed
        assert ("NOT shown" in dom.text["states"]) is failed  # (a state no record wrote)
        assert dom.rows["8"]["found"] == ("FOUND" if failed else "no")
        assert ("[chain]" in dom.text.get("problems", "")) is failed


def test_the_bits_shown_are_the_audits() -> None:
    """The page's table of exit bits is the audit's, number for number (findings.py fixes them)."""
    assert {kind: bit for bit, kind, _ in page.BITS} == {
        k: v for k, v in EXIT_BITS.items() if k not in ("head", "malformed")}


def test_a_screenshot_shows_a_drawn_page(service, tmp_path: Path) -> None:
    from PIL import Image

    png = _browser.screenshot(service(), tmp_path / "page.png", width=1200, height=1600)
    assert len(png) > 20_000
    with Image.open(tmp_path / "page.png") as image:
        assert image.size == (1200, 1600)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 50  # text, bars and the plot: not one colour


def test_a_link_opens_the_page_once_in_the_browser(service) -> None:
    """The link is the owner's for one opening: a second load of it is refused (no page)."""
    link = service()
    assert Dom(_browser.dump_dom(link)).title == TITLE
    assert Dom(_browser.dump_dom(link)).title != TITLE
