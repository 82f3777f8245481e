"""What a server process holds (dpbudget.accountant.service.state), in process: the analyst is
the token's under the policy in force (a token revoked by the owner is refused from the next
request, a policy changed under a debit authenticates again; tokens and accountant are read as
one pair), the rate is per token, and a request whose client was answered before its debit
began is never debited. Deadlines here are already past or given up: no test waits on a clock."""

from __future__ import annotations

from pathlib import Path

import pytest

import dpbudget as dp
from dpbudget.accountant.gate import policy_record
from dpbudget.accountant.service.data import load_data
from dpbudget.accountant.service.state import Deadline, Held, RateLimit
from dpbudget.accountant.service.tokens import without_token
from dpbudget.accountant.service.wire import Query
from dpbudget.accountant.values.errors import ServiceError
from tests.service._site import make_site


def _held(tmp_path: Path) -> tuple[Held, object]:
    site = make_site(tmp_path)
    acc = dp.Accountant.open(site.ledger)
    return Held(acc, load_data(site.folder / "data.toml"), RateLimit(1000.0, 1000)), site


COUNT = Query(table="visits", statistic="count", epsilon=0.01)
FAR = 1e9  # a deadline (monotonic s) no test reaches (31 years of uptime)


def _query(held: Held, token: str, spec: Query = COUNT, at: float = FAR) -> tuple[object, object]:
    return held.query(token, held.admit(token), spec, Deadline(at))


def _head(held: Held) -> tuple[int, str]:
    return held.ledger.head()  # type: ignore[no-any-return]


def test_the_charge_is_the_tokens_analyst(tmp_path: Path) -> None:
    held, site = _held(tmp_path)
    who = held.admit(site.tokens["bob"])  # type: ignore[attr-defined]
    _, receipt = held.query(site.tokens["bob"], who, COUNT, Deadline(FAR))  # type: ignore[attr-defined]
    assert receipt.analyst == "bob" and who.analyst == "bob"  # type: ignore[attr-defined]


def test_a_token_revoked_by_another_process_is_refused_next(tmp_path: Path) -> None:
    held, site = _held(tmp_path)
    token = site.tokens["bob"]  # type: ignore[attr-defined]
    _query(held, token)
    with dp.Accountant.open(site.ledger) as owner:  # type: ignore[attr-defined]
        owner.apply_policy(without_token(owner.policy, token.split("_")[1]), by="o",
                           reason="revoked", owner_key=site.key)  # type: ignore[attr-defined]
    with pytest.raises(ServiceError) as refused:
        _query(held, token)
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
    who = held.admit(token)
    assert who.analyst == "bob"
    with pytest.raises(dp.PolicyChangedError):
        held._run(who, COUNT, Deadline(FAR))


def test_a_token_is_checked_against_the_accountant_it_is_charged_by(tmp_path: Path) -> None:
    """The race of issue 35: a thread swaps the accountant (the token revoked) between a
    request's reading of the tokens and its reading of the accountant. Tokens and accountant
    are one pair: a request admitted under the old pair runs on the old accountant, whose gate
    refuses the debit (the policy changed) and the query is authenticated again: 401."""
    held, site = _held(tmp_path)
    token = site.tokens["bob"]  # type: ignore[attr-defined]
    who = held.admit(token)  # (authenticated under the old pair)
    with dp.Accountant.open(site.ledger) as owner:  # type: ignore[attr-defined]
        owner.apply_policy(without_token(owner.policy, token.split("_")[1]), by="o",
                           reason="revoked", owner_key=site.key)  # type: ignore[attr-defined]
    held.refresh()  # (another request's thread swaps in the new pair)
    assert who.accountant is not held.accountant
    before = _head(held)
    with pytest.raises(ServiceError) as refused:
        held.query(token, who, COUNT, Deadline(FAR))
    assert refused.value.status == 401 and _head(held) == before


def test_negative_control_tokens_old_accountant_new_charges_the_revoked_token(
        tmp_path: Path) -> None:
    """The old split re-created: the analyst from the old tokens, the run on the accountant
    swapped in since — the revoked token's query is charged under the new policy."""
    held, site = _held(tmp_path)
    token = site.tokens["bob"]  # type: ignore[attr-defined]
    old = held.admit(token)
    with dp.Accountant.open(site.ledger) as owner:  # type: ignore[attr-defined]
        owner.apply_policy(without_token(owner.policy, token.split("_")[1]), by="o",
                           reason="revoked", owner_key=site.key)  # type: ignore[attr-defined]
    held.refresh()
    _, receipt = held._run(old._replace(accountant=held.accountant), COUNT, Deadline(FAR))
    assert receipt.analyst == "bob"  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["client gone", "deadline past"])
def test_a_query_whose_request_gave_up_before_its_debit_spends_nothing(
        tmp_path: Path, how: str) -> None:
    """Issue 35's figure: queries queued (then behind a release lock, now gone) paid after
    their clients were answered. Now the debit starts only for a request still there: refused, nothing debited,
    and the request's own view agrees (``give_up`` says nothing was spent)."""
    held, site = _held(tmp_path)
    token = site.tokens["bob"]  # type: ignore[attr-defined]
    deadline = Deadline(0.0 if how == "deadline past" else FAR)
    if how == "client gone":
        assert deadline.give_up()
    before = _head(held)
    with pytest.raises(ServiceError, match="nothing was drawn or debited") as refused:
        held.query(token, held.admit(token), COUNT, deadline)
    assert refused.value.status == 503 and _head(held) == before
    assert deadline.give_up()  # (the request's answer: nothing spent)


def test_negative_control_without_the_deadline_check_the_gone_request_pays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old worker re-created (no check before the debit): the request that gave up is
    debited all the same — the 8 debits for 8 answers thrown away."""
    held, site = _held(tmp_path)
    token = site.tokens["bob"]  # type: ignore[attr-defined]
    monkeypatch.setattr(Deadline, "start_debit", lambda self: True)
    deadline = Deadline(FAR)
    deadline.give_up()
    before = _head(held)
    held.query(token, held.admit(token), COUNT, deadline)
    assert _head(held)[0] == before[0] + 1


def test_once_the_debit_began_giving_up_says_it_may_be_spent() -> None:
    deadline = Deadline(FAR)
    assert deadline.start_debit() and not deadline.give_up() and deadline.start_debit()


def test_an_unknown_table_is_refused_without_naming_the_others(tmp_path: Path) -> None:
    held, site = _held(tmp_path)
    with pytest.raises(dp.InvalidArgumentError) as refused:
        _query(held, site.tokens["bob"], COUNT.model_copy(update={"table": "payroll"}))  # type: ignore[attr-defined]
    assert "visits" not in str(refused.value) and "serves" in str(refused.value)


def test_the_rate_is_per_token_and_refills() -> None:
    limit = RateLimit(rate=1.0, burst=2)
    assert [limit.take("a", 0.0) for _ in range(3)] == [True, True, False]
    assert limit.take("b", 0.0) and limit.take("a", 1.0) and not limit.take("a", 1.0)


def test_a_read_that_outlasts_the_request_is_not_debited(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline is checked after the query has read its data, right before the debit: a
    request whose client is answered while the read still runs (here: gives up during the
    read) is refused and spends nothing. Negative control: checked before the read (the first
    fix's order), the debit lands for an answer no one receives."""
    from dpbudget.accountant.tables import frames

    held, site = _held(tmp_path)
    token = site.tokens["bob"]  # type: ignore[attr-defined]
    real = frames.check_values

    def slow_read(deadline: Deadline, told: bool = True) -> None:
        def read(*args: object, **kwargs: object) -> object:
            out = real(*args, **kwargs)  # (the client is answered while the read runs: told
            assert deadline.give_up() is told  # "nothing spent", or "may be spent")
            return out
        monkeypatch.setattr(frames, "check_values", read)

    deadline = Deadline(FAR)
    slow_read(deadline)
    before = _head(held)
    with pytest.raises(ServiceError, match="nothing was drawn or debited"):
        held.query(token, held.admit(token), COUNT, deadline)
    assert _head(held) == before

    monkeypatch.undo()  # Negative control: the check before the read
    deadline = Deadline(FAR)
    assert deadline.start_debit()
    slow_read(deadline, told=False)
    monkeypatch.setattr(Deadline, "start_debit", lambda self: True)
    held.query(token, held.admit(token), COUNT, deadline)
    assert _head(held)[0] == before[0] + 1
