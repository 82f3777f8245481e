"""What a server process holds (dpbudget.accountant.service.state), in process: the analyst is
the token's under the policy in force (a token revoked by the owner is refused from the next
request, a policy changed under a debit authenticates again), and the rate is per token."""

from __future__ import annotations

from pathlib import Path

import pytest

import dpbudget as dp
from dpbudget.accountant.gate import policy_record
from dpbudget.accountant.service.data import load_data
from dpbudget.accountant.service.state import Held, RateLimit
from dpbudget.accountant.service.tokens import without_token
from dpbudget.accountant.service.wire import Query
from dpbudget.accountant.values.errors import ServiceError
from tests.service._site import make_site


def _held(tmp_path: Path) -> tuple[Held, object]:
    site = make_site(tmp_path)
    acc = dp.Accountant.open(site.ledger)
    return Held(acc, load_data(site.folder / "data.toml"), RateLimit(1000.0, 1000)), site


COUNT = Query(table="visits", statistic="count", epsilon=0.01)


def test_the_charge_is_the_tokens_analyst(tmp_path: Path) -> None:
    held, site = _held(tmp_path)
    seen: dict[str, object] = {}
    _, receipt = held.query(site.tokens["bob"], COUNT, seen)  # type: ignore[attr-defined]
    assert receipt.analyst == "bob" and seen["analyst"] == "bob"


def test_a_token_revoked_by_another_process_is_refused_next(tmp_path: Path) -> None:
    held, site = _held(tmp_path)
    token = site.tokens["bob"]  # type: ignore[attr-defined]
    held.query(token, COUNT, {})
    with dp.Accountant.open(site.ledger) as owner:  # type: ignore[attr-defined]
        owner.apply_policy(without_token(owner.policy, token.split("_")[1]), by="o",
                           reason="revoked", owner_key=site.key)  # type: ignore[attr-defined]
    with pytest.raises(ServiceError) as refused:
        held.query(token, COUNT, {})
    assert refused.value.status == 401


def test_negative_control_without_refresh_the_revoked_token_still_authenticates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old tokens, kept: the token authenticates — and the gate's own check inside the
    debit (the policy changed) is what still refuses to charge under the old policy."""
    held, site = _held(tmp_path)
    token = site.tokens["bob"]  # type: ignore[attr-defined]
    with dp.Accountant.open(site.ledger) as owner:  # type: ignore[attr-defined]
        owner.apply_policy(without_token(owner.policy, token.split("_")[1]), by="o",
                           reason="revoked", owner_key=site.key)  # type: ignore[attr-defined]
    monkeypatch.setattr(Held, "refresh", lambda self: None)
    assert held.analyst(token)[0] == "bob"
    with pytest.raises(dp.PolicyChangedError):
        held._run("bob", COUNT)


def test_the_rate_is_per_token_and_refills() -> None:
    limit = RateLimit(rate=1.0, burst=2)
    assert [limit.take("a", 0.0) for _ in range(3)] == [True, True, False]
    assert limit.take("b", 0.0) and limit.take("a", 1.0) and not limit.take("a", 1.0)
