"""The query service over HTTP (dpbudget.accountant.service.app), against the real server (uvicorn
in a subprocess on a loopback port) through the real client, as the attacks of issue 35:

* the quota bypass — alice (quota ε = 0.3) asks for ε = 1.0 by naming bob — is refused in every
  field a request could carry; the negative control is the in-process ``analyst=`` bypass;
* a forged, expired or revoked token gets 401 and costs nothing (the ledger's head unchanged);
* a body over the cap gets 413, a token over its rate 429, a query past the time limit releases
  nothing and says its budget may be spent; every request is logged without token or value.
"""

from __future__ import annotations

import json
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

        Owner(url, site.key).revoke_token(policy_record.stored_policy(site.ledger)[0],
                                          site.tokens["bob"].split("_")[1], by="owner",
                                          reason="bob left")
    token = {"forged": site.tokens["alice"][:-4] + "AAAA", "expired": site.tokens["expired"],
             "malformed": "alice", "missing": "", "revoked": site.tokens["bob"]}[which]
    before = head(site.ledger)
    with pytest.raises(ServiceError) as refused:
        connect(url, token=token).table("visits").count(epsilon=0.01).release()
    assert refused.value.status == 401
    assert head(site.ledger) == before


def test_negative_control_the_same_tokens_valid_do_release(site: Site, url: str) -> None:
    """The 401s above are the tokens', not the server's: alice's own token releases."""
    service = connect(url, token=site.tokens["alice"])
    assert service.table("visits").count(epsilon=0.01).release() > 0
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
        assert secret not in text and secret.split("_")[2] not in text
    assert "x" * 43 not in text and "Bearer" not in text


def test_owner_endpoints_refuse_a_replay_and_a_missing_signature(site: Site, url: str) -> None:
    from dpbudget.accountant.gate.owner_key import load
    from dpbudget.accountant.service.owner import sign_request

    headers = sign_request(load(site.key), "GET", "/owner/status.json", b"", time.time())
    request = urllib.request.Request(url + "/owner/status.json", headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read())["owner"] == load(site.key).public
    for sent in (headers, {}):  # the same signed request again; no signature at all
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url + "/owner/status.json",
                                                          headers=sent), timeout=60)
        with refused.value:
            assert refused.value.code == 401
    assert Owner(url, site.key).audit()["exit_status"] == 0
    with urllib.request.urlopen(urllib.request.Request(url + "/owner/status", headers=sign_request(
            load(site.key), "GET", "/owner/status", b"", time.time())), timeout=60) as response:
        page = response.read().decode()
    assert "Chain check passed" in page and "dataset:visits/analyst:alice" in page


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
    with server(site, "--time-limit", "0.000001") as (url, _):
        with pytest.raises(LedgerUnconfirmedError, match="time limit"):
            connect(url, token=site.tokens["bob"]).table("visits").count(epsilon=0.01).release()


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
        app = build_app(Held(acc, load_data(str(site.folder / "data.toml")), RateLimit(5, 5)))
        routes = {(r.path, m) for r in app.routes for m in r.methods or ()}  # type: ignore[attr-defined]
    finally:
        acc.close()
    assert routes - {(p, "HEAD") for p, _ in routes} == {
        ("/v1/query", "POST"), ("/v1/remaining", "GET"), ("/owner/status", "GET"),
        ("/owner/status.json", "GET"), ("/owner/audit", "GET"), ("/owner/policy", "POST")}
