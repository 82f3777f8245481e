"""The query service over HTTP (dpbudget.accountant.service.app), against the real server (uvicorn
in a subprocess on a loopback port) through the real client, as the attacks of issue 35:

* the quota bypass — alice (quota ε = 0.3) asks for ε = 1.0 by naming bob — is refused in every
  field a request could carry; the negative control is the in-process ``analyst=`` bypass;
* a forged, expired or revoked token gets 401 and costs nothing (the ledger's head unchanged);
* a body over the cap gets 413, a token over its rate 429, a query past the time limit releases
  nothing and says whether its budget was spent (never debited once its client was answered);
  every request is logged without token or value;
* owner requests: a replay (its base64 twin too), another Host or ledger, a request the owner
  signed for another URL and relayed here (the Host rewritten to match), a time that is not 1
  to 12 ASCII digits get 401; a fault on an owner route never speaks of budget; the status
  link opens once, with the page's headers;
* on PostgreSQL, one server connected as the owner role serves every analyst's token, each held
  to its own quota.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dpbudget as dp
from dpbudget.accountant.service.client import Owner, connect
from dpbudget.accountant.tables.builder import table
from dpbudget.accountant.values.errors import (BudgetExceededError, InvalidArgumentError,
                                               LedgerUnconfirmedError, ServiceError)
from tests.service._site import Site, head, make_site, server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    return make_site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def url(site: Site) -> Iterator[str]:
    with server(site) as (address, _):
        yield address


def _post(url: str, body: Any, token: str, headers: dict[str, str] | None = None) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + "/v1/query", data, {
        "authorization": f"Bearer {token}", "content-type": "application/json",
        **(headers or {})}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


ONE = {"table": "visits", "statistic": "count", "epsilon": 1.0}


@pytest.mark.parametrize("field", ["analyst", "user", "as_analyst", "dataset", "clock", "seed",
                                   "rng", "sensitivity", "mechanism", "token"])
def test_the_quota_bypass_naming_bob_is_refused_in_any_field(site: Site, url: str,
                                                              field: str) -> None:
    """The issue's figure: alice (quota 0.3) asks for ε = 1.0 naming bob. Refused (a field the
    wire does not have), nothing debited; nothing a request names is ever the analyst."""
    before = head(site.ledger)
    status, reply = _post(url, {**ONE, field: "bob"}, site.tokens["alice"])
    assert status == 400 and reply["error"]["type"] == "InvalidArgumentError"
    assert field in reply["error"]["message"]
    assert head(site.ledger) == before


def test_bob_in_the_label_or_a_header_is_still_charged_to_alice(site: Site, url: str) -> None:
    """Where the request may carry a name (a label, any header), the charge is still alice's:
    her quota refuses ε = 1.0, on her account."""
    before = head(site.ledger)
    status, reply = _post(url, {**ONE, "label": "bob"}, site.tokens["alice"],
                          {"x-analyst": "bob", "x-dpbudget-analyst": "bob"})
    assert status == 403 and reply["error"]["type"] == "BudgetExceededError"
    assert reply["error"]["attrs"]["account"] == "dataset:visits/analyst:alice"
    assert head(site.ledger) == before


def test_negative_control_in_process_alice_calls_herself_bob(site: Site, tmp_path: Path) -> None:
    """Without the boundary, alice's own code holds the accountant and names bob: ε = 1.0
    against her quota of 0.3 is released (on a copy of the site's policy)."""
    acc = dp.Accountant.from_policy(site.folder / "policy.toml",
                                    ledger=f"sqlite:///{tmp_path / 'own.db'}")
    source = str(site.folder / "visits.parquet")
    with pytest.raises(BudgetExceededError):
        table(acc, source, dataset="visits", analyst="alice").count(epsilon=1.0).release()
    assert table(acc, source, dataset="visits", analyst="bob").count(epsilon=1.0).release() > 0
    assert acc.spent("visits", analyst="bob").epsilon == 1.0
    acc.close()


@pytest.mark.parametrize("which", ["forged", "expired", "malformed", "missing", "revoked"])
def test_a_bad_token_gets_401_and_costs_nothing(site: Site, url: str, which: str) -> None:
    if which == "revoked":  # bob's token revoked by the owner, through the service
        from dpbudget.accountant.gate import policy_record

        Owner(url, site.key, ledger=site.identity).revoke_token(
            policy_record.stored_policy(site.ledger)[0], site.tokens["bob"].split("_")[1],
            by="owner", reason="bob left")
    token = {"forged": site.tokens["alice"][:-4] + "AAAA", "expired": site.tokens["expired"],
             "malformed": "alice", "missing": "", "revoked": site.tokens["bob"]}[which]
    before = head(site.ledger)
    with pytest.raises(ServiceError) as refused:
        connect(url, token=token).table("visits").count(epsilon=0.01).release()
    assert refused.value.status == 401
    assert head(site.ledger) == before


def test_negative_control_the_same_tokens_valid_do_release(site: Site, url: str) -> None:
    """The 401s above are the tokens', not the server's: alice's own token releases (a noisy
    count at ε = 0.01 has Laplace scale 1,000 around ~3,000: its sign is not the test's)."""
    service = connect(url, token=site.tokens["alice"])
    assert math.isfinite(service.table("visits").count(epsilon=0.01).release())
    assert service.last_receipt is not None and service.last_receipt["analyst"] == "alice"
    assert service.remaining("visits")["analyst"]["epsilon"] == pytest.approx(0.29)


def test_every_request_is_logged_without_token_or_value(site: Site, url: str) -> None:
    _post(url, {**ONE, "analyst": "bob"}, site.tokens["alice"])
    _post(url, ONE, "dpb_0123456789abcdef_" + "x" * 43)
    time.sleep(0.2)
    text = (site.folder / "requests.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert {line["status"] for line in lines} >= {400, 401}
    for secret in site.tokens.values():
        assert secret not in text and secret.split("_", 2)[2] not in text  # (the secret may
        # hold "_" itself)
    assert "x" * 43 not in text and "Bearer" not in text


def _owner_get(url: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers),
                                    timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def _signed(site: Site, url: str, path: str) -> dict[str, str]:
    from urllib.parse import urlsplit

    from dpbudget.accountant.gate.owner_key import load
    from dpbudget.accountant.service.owner import sign_request

    return sign_request(load(site.key), "GET", urlsplit(url).netloc, path,
                        site.identity, b"", time.time())


def test_owner_endpoints_refuse_a_replay_and_a_missing_signature(site: Site, url: str) -> None:
    from dpbudget.accountant.gate.owner_key import load

    headers = _signed(site, url, "/owner/status.json")
    status, body = _owner_get(url, "/owner/status.json", headers)
    assert status == 200 and json.loads(body)["owner"] == load(site.key).public
    for sent in (headers, {}):  # the same signed request again; no signature at all
        assert _owner_get(url, "/owner/status.json", sent)[0] == 401
    assert Owner(url, site.key, ledger=site.identity).audit()["exit_status"] == 0
    status, body = _owner_get(url, "/owner/status", _signed(site, url, "/owner/status"))
    page = body.decode()
    assert "Chain check passed" in page and "dataset:visits/analyst:alice" in page


def test_a_replayed_owner_request_in_its_base64_twin_gets_401(site: Site, url: str) -> None:
    """The reviewer's attack: the signature re-spelt in the unused low bits of its last
    character (the same 64 bytes) replayed a GET /owner/status.json with 200. Now 401."""
    from dpbudget.accountant.service.owner import SIG
    from tests.service.test_owner import _twin

    headers = _signed(site, url, "/owner/status.json")
    assert _owner_get(url, "/owner/status.json", headers)[0] == 200
    twin = {**headers, SIG: _twin(headers[SIG])}
    status, body = _owner_get(url, "/owner/status.json", twin)
    assert status == 401 and b"replay" in body


def test_an_owner_request_signed_for_another_host_gets_401(site: Site, url: str) -> None:
    """Signed for another server (its Host) or another ledger: refused here, and the same
    request signed for this one passes (the control)."""
    from dpbudget.accountant.gate.owner_key import load
    from dpbudget.accountant.service.owner import sign_request

    identity = site.identity
    for host, ledger in (("other.example.org:8443", identity), (url[7:], "cd" * 32)):
        headers = sign_request(load(site.key), "GET", host, "/owner/status.json", ledger, b"",
                               time.time())
        assert _owner_get(url, "/owner/status.json", headers)[0] == 401
    assert _owner_get(url, "/owner/status.json", _signed(site, url, "/owner/status.json"))[0] \
        == 200


def test_a_relayed_owner_request_signed_for_another_url_gets_401(site: Site, url: str) -> None:
    """The reviewer's attack: the owner, sent to a hijacked URL (evil.example), signs for it
    with the ledger's identity (which it pins, or which the relay fetched from here); the relay
    sends that request here with ``Host: evil.example``, within the window. The server checks
    the signature for its own public URL, never the Host: 401. The negative control: the old
    check, which verified for the Host the request names, admits this very request."""
    from dpbudget.accountant.gate.owner_key import load
    from dpbudget.accountant.service.owner import SIG, TIME, Replays, sign_request

    headers = sign_request(load(site.key), "GET", "evil.example", "/owner/status.json",
                           site.identity, b"", time.time())
    status, body = _owner_get(url, "/owner/status.json", {**headers, "host": "evil.example"})
    assert status == 401 and b"another Host" in body
    old = Replays().check(load(site.key).public, "GET", "evil.example", "/owner/status.json",
                          site.identity, b"", headers[TIME], headers[SIG], time.time())
    assert old is None  # (the old server passed the request's Host here: admitted)
    # Signed for evil.example and sent with this server's own Host: the signature fails.
    status, body = _owner_get(url, "/owner/status.json", headers)
    assert status == 401 and b"does not verify" in body


@pytest.mark.parametrize("seconds", ["\u00b2", "1" * 5000])
def test_an_owner_time_that_int_refuses_gets_401_not_a_fault(site: Site, url: str,
                                                             seconds: str) -> None:
    """The reviewer's figures: ``²`` and 5000 digits passed ``isdigit()`` and made ``int()``
    raise: 500, "budget may have been debited". Now 401, saying nothing of budget (the unit
    test's negative control shows the old check passing them to an ``int()`` that raises)."""
    from urllib.parse import quote

    from dpbudget.accountant.service.owner import SIG, TIME

    headers = {**_signed(site, url, "/owner/status.json")}
    headers[TIME] = f"{seconds}.00"  # (² is Latin-1: sent as it is, read back as it is)
    status, body = _owner_get(url, "/owner/status.json", headers)
    assert status == 401 and b"budget" not in body and b"1 to 12 digits" in body
    # And through a link's query string, %-escaped, as a browser sends it.
    query = f"/owner/status?t={quote(seconds + '.00')}&s={quote(headers[SIG])}"
    status, body = _owner_get(url, query, {})
    assert status == 401 and b"budget" not in body


def test_the_status_link_opens_once_with_the_pages_headers(site: Site, url: str) -> None:
    link = Owner(url, site.key, ledger=site.identity).status_link()
    with urllib.request.urlopen(link, timeout=60) as response:
        headers, page = response.headers, response.read().decode()
    assert "Chain check passed" in page
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "default-src 'none'" in headers["content-security-policy"]
    assert (headers["cache-control"], headers["x-content-type-options"],
            headers["referrer-policy"]) == ("no-store", "nosniff", "no-referrer")
    assert _owner_get(url, link[len(url):], {})[0] == 401  # (opened once)
    # The link's signature opens only the page: the same query on the JSON status is refused.
    other = Owner(url, site.key, ledger=site.identity).status_link().replace(
        "/owner/status?", "/owner/status.json?")
    assert _owner_get(url, other[len(url):], {})[0] == 401


def test_an_unknown_dataset_is_refused_without_naming_the_others(site: Site, url: str) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        connect(url, token=site.tokens["alice"]).remaining("payroll")
    assert "visits" not in str(refused.value) and "serves" in str(refused.value)
    # The negative control: the accountant's own refusal lists the policy's datasets.
    with dp.Accountant.open(site.ledger) as acc, pytest.raises(InvalidArgumentError) as listed:
        acc.remaining("payroll")
    assert "visits" in str(listed.value)


def test_limits_body_rate_and_time(tmp_path: Path) -> None:
    """413 over the body cap, 429 over the token's rate (nothing debited), and a query past the
    time limit releases nothing and says the budget may be spent."""
    site = make_site(tmp_path)
    with server(site, "--max-body", "2000", "--rate", "0.001", "--burst", "2") as (url, _):
        before = head(site.ledger)
        status, reply = _post(url, {**ONE, "label": "x" * 3000}, site.tokens["bob"])
        assert status == 413 and reply["error"]["attrs"]["status"] == 413
        bob = connect(url, token=site.tokens["bob"]).table("visits")
        bob.count(epsilon=0.01).accuracy(), bob.count(epsilon=0.01).accuracy()
        with pytest.raises(ServiceError) as refused:
            bob.count(epsilon=0.01).release()
        assert refused.value.status == 429 and head(site.ledger) == before
    before = head(site.ledger)
    with server(site, "--time-limit", "0.000001") as (url, _):
        with pytest.raises(ServiceError, match="nothing was drawn or debited") as refused:
            connect(url, token=site.tokens["bob"]).table("visits").count(epsilon=0.01).release()
        assert refused.value.status == 503
    assert head(site.ledger) == before  # (the server stopped: its workers are done)


def _asgi(app: Any, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
    """One request to ``app`` through the ASGI interface itself: (status, body)."""
    import asyncio

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("testserver", 80),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


@pytest.mark.parametrize("who", ["analyst", "owner", "negative control"])
def test_a_request_held_past_its_time_limit_says_what_it_spent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, who: str) -> None:
    """Deterministic: the worker is held (an event) until the request's time limit has answered
    it. The analyst's query, which had not begun its debit, is answered that nothing was spent
    and the worker, released, debits nothing; an owner GET is answered without a word of
    budget (it has none to spend). The negative control re-creates the old worker (no check
    before the debit): released, it debits for the answer thrown away."""
    import threading

    from dpbudget.accountant.gate.accountant import Accountant
    from dpbudget.accountant.gate.owner_key import load
    from dpbudget.accountant.service.app import build_app
    from dpbudget.accountant.service.data import load_data
    from dpbudget.accountant.service.owner import sign_request
    from dpbudget.accountant.service.state import Deadline, Held, RateLimit

    if who == "negative control":
        monkeypatch.setattr(Deadline, "start_debit", lambda self: True)
    site = make_site(tmp_path)
    acc = Accountant.open(site.ledger)
    held = Held(acc, load_data(site.folder / "data.toml"), RateLimit(5, 5))
    go, done = threading.Event(), threading.Event()
    hold = "refresh" if who == "owner" else "query"  # (in the worker, before any debit)
    real = getattr(Held, hold)

    def held_up(self: Held, *args: Any) -> Any:
        go.wait(60)
        try:
            return real(self, *args)
        finally:
            done.set()  # (the worker's work is over: any debit it made is in the ledger)
    try:
        app = build_app(held, public_url="http://testserver", time_limit=0.05)
        before = head(site.ledger)
        if who != "owner":
            headers = {"authorization": f"Bearer {site.tokens['bob']}", "host": "testserver"}
            path, body = "/v1/query", json.dumps(ONE).encode()
            monkeypatch.setattr(Held, hold, held_up)
            status, reply = _asgi(app, "POST", path, headers, body)
        else:
            from dpbudget.accountant.gate import policy_record

            headers = {"host": "testserver", **sign_request(
                load(site.key), "GET", "testserver", "/owner/status.json",
                str(policy_record._first(acc.ledger)[1]), b"", time.time())}
            monkeypatch.setattr(Held, hold, held_up)
            status, reply = _asgi(app, "GET", "/owner/status.json", headers, b"")
        go.set()
        assert done.wait(60)
        message = reply["error"]["message"]
        if who == "owner":
            assert status == 504 and "budget" not in message
        elif who == "analyst":
            assert status == 503 and "nothing was drawn or debited" in message
    finally:
        go.set()
        acc.close()
    assert (head(site.ledger) == before) is (who != "negative control")


@pytest.mark.parametrize("route", ["owner", "negative control: analyst"])
def test_a_fault_on_an_owner_route_never_speaks_of_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str) -> None:
    """An owner request spends no budget, so a fault of the service on its route (here the
    policy refresh raising) is a 500 that says a policy change may be written, not that budget
    may be spent. The negative control: the same fault on the analyst's route says budget."""
    from dpbudget.accountant.gate.accountant import Accountant
    from dpbudget.accountant.gate.owner_key import load
    from dpbudget.accountant.service.app import build_app
    from dpbudget.accountant.service.data import load_data
    from dpbudget.accountant.service.owner import sign_request
    from dpbudget.accountant.service.state import Held, RateLimit

    def fault(self: Held, *args: Any) -> Any:
        raise RuntimeError("a fault")

    site = make_site(tmp_path)
    acc = Accountant.open(site.ledger)
    try:
        app = build_app(Held(acc, load_data(site.folder / "data.toml"), RateLimit(5, 5)),
                        public_url="http://testserver")
        if route == "owner":
            monkeypatch.setattr(Held, "refresh", fault)
            headers = {"host": "testserver", **sign_request(
                load(site.key), "GET", "testserver", "/owner/status.json", site.identity, b"",
                time.time())}
            status, reply = _asgi(app, "GET", "/owner/status.json", headers, b"")
        else:
            monkeypatch.setattr(Held, "query", fault)
            headers = {"authorization": f"Bearer {site.tokens['bob']}", "host": "testserver"}
            status, reply = _asgi(app, "POST", "/v1/query", headers, json.dumps(ONE).encode())
    finally:
        acc.close()
    message = reply["error"]["message"]
    assert status == 500 and "RuntimeError" in message and "a fault" not in message
    assert ("budget" in message) is (route != "owner")


def test_queries_queued_past_the_time_limit_never_pay_for_thrown_answers(tmp_path: Path) -> None:
    """Issue 35's figure: --time-limit 0.3, 8 concurrent quantile queries; all 8 were answered
    500 and 8 debits landed later, for answers thrown away. Now a query whose debit had not
    begun when its client was answered is never debited: after the server stopped (its workers
    done), the debits are at least the answers and at most the answers plus the replies that
    said the budget may be spent. (The in-process negative control: test_state.py.)"""
    import concurrent.futures

    site = make_site(tmp_path)
    before = head(site.ledger)[0]
    with server(site, "--time-limit", "0.3") as (url, _):
        def ask(_: int) -> str:
            q = connect(url, token=site.tokens["bob"]).table("visits").quantile(
                "amount", 0.5, lower=0.0, upper=100.0, epsilon=0.01)
            try:
                q.release()
                return "answered"
            except LedgerUnconfirmedError:
                return "may be spent"
            except ServiceError as exc:
                assert exc.status == 503 and "nothing was drawn or debited" in str(exc)
                return "nothing spent"
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(ask, range(8)))
    debits = head(site.ledger)[0] - before
    answered, maybe = replies.count("answered"), replies.count("may be spent")
    assert answered <= debits <= answered + maybe, replies  # ("nothing spent": no debit)


def test_a_refusal_comes_back_as_the_same_typed_error(site: Site, url: str) -> None:
    alice = connect(url, token=site.tokens["alice"]).table("visits")
    with pytest.raises(BudgetExceededError) as refused:
        alice.count(epsilon=1.0).release()
    assert refused.value.requested == dp.Budget(1.0) and refused.value.dataset == "visits"
    with pytest.raises(InvalidArgumentError, match="column"):
        alice.filter("nope", "==", 1).count(epsilon=0.01).release()


def test_every_route_is_an_analysts_or_the_owners(tmp_path: Path) -> None:
    """The app serves exactly the documented routes: ``/v1/*`` behind a token, ``/owner/*``
    behind the owner's signature. A route added anywhere else would be reachable with neither,
    and this test fails until it is listed (and its authentication tested) here."""
    from dpbudget.accountant.gate.accountant import Accountant
    from dpbudget.accountant.service.app import build_app
    from dpbudget.accountant.service.data import load_data
    from dpbudget.accountant.service.state import Held, RateLimit

    site = make_site(tmp_path)
    acc = Accountant.open(site.ledger)
    try:
        app = build_app(Held(acc, load_data(str(site.folder / "data.toml")), RateLimit(5, 5)),
                        public_url="http://testserver")
        routes = {(r.path, m) for r in app.routes for m in r.methods or ()}  # type: ignore[attr-defined]
    finally:
        acc.close()
    assert routes - {(p, "HEAD") for p, _ in routes} == {
        ("/v1/query", "POST"), ("/v1/remaining", "GET"), ("/owner/status", "GET"),
        ("/owner/status.json", "GET"), ("/owner/audit", "GET"), ("/owner/policy", "POST")}


# -- PostgreSQL: the service connected as the ledger tables' owner role (issue 35) ----------------

@pytest.fixture
def deployment(postgres_database: str) -> Iterator[Any]:
    from tests.ledger.postgres.test_schema import Deployment

    made = Deployment(postgres_database)
    try:
        yield made
    finally:
        made.drop()


@pytest.mark.postgres
def test_two_analysts_race_their_quotas_through_one_owner_session(deployment: Any,
                                                                   tmp_path: Path) -> None:
    """alice (quota ε = 0.3) and bob (5.0), 8 clients each, ε = 0.1 and 0.5 a query, until
    refused, at once through one server whose ledger session is the owner role: alice gets 0.3
    and bob 5.0, each record theirs."""
    import concurrent.futures

    from dpbudget.accountant.ledger.postgres import PostgresLedger

    site = make_site(tmp_path, ledger=deployment.dsn(deployment.owner))
    with PostgresLedger(site.ledger) as ledger:
        assert ledger.authenticated_analyst is None  # (the owner's session)
    got: dict[str, float] = {"alice": 0.0, "bob": 0.0}
    with server(site) as (url, _):
        def drain(who: str) -> float:
            q = connect(url, token=site.tokens[who]).table("visits")
            eps, total = (0.1 if who == "alice" else 0.5), 0.0
            while True:
                try:
                    q.count(epsilon=eps).release()
                except BudgetExceededError:
                    return total
                total += eps
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            jobs = [(who, pool.submit(drain, who)) for who in ("alice", "bob") for _ in range(8)]
            for who, job in jobs:
                got[who] += job.result()
    assert got == {"alice": pytest.approx(0.3), "bob": pytest.approx(5.0)}
    from dpbudget.accountant.gate.accountant import Accountant

    with Accountant.open(site.ledger) as acc:
        assert acc.spent("visits", analyst="alice").epsilon == pytest.approx(0.3)
        assert acc.spent("visits", analyst="bob").epsilon == pytest.approx(5.0)


@pytest.mark.postgres
def test_negative_control_the_owner_session_as_its_own_analyst_refuses_every_token(
        deployment: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old reading re-created (the owner's session authenticates the owner role): a query
    for the token's analyst is refused as another name — what made one server serve only the
    token whose analyst was the login role."""
    from dpbudget.accountant.gate.accountant import Accountant
    from dpbudget.accountant.ledger.postgres import PostgresLedger
    from dpbudget.accountant.values.errors import AnalystMismatchError

    site = make_site(tmp_path, ledger=deployment.dsn(deployment.owner))
    monkeypatch.setattr(PostgresLedger, "authenticated_analyst",
                        property(lambda self: self._s.role))
    with Accountant.open(site.ledger) as acc:
        with pytest.raises(AnalystMismatchError):
            table(acc, str(site.folder / "visits.parquet"), dataset="visits",
                  analyst="bob").count(epsilon=0.1).release()
