"""API tokens (dpbudget.accountant.service.tokens): only a listed, unexpired token whose secret
hashes to the listed hash names an analyst — the analyst the policy lists it under; a token added
to a policy is a grant the audit lists, one removed is not."""

from __future__ import annotations

import hashlib

import pytest

from dpbudget.accountant.service import tokens
from dpbudget.accountant.values.errors import InvalidArgumentError
from dpbudget.policies.policy import parse_policy
from dpbudget.policies.stored import document, raised

BASE = parse_policy("[datasets.d]\nlimit = { epsilon = 1.0 }\n[analysts.bob]\n"
                    "limit = { epsilon = 0.5 }\n", "toml")


def test_a_token_names_the_analyst_it_is_listed_under() -> None:
    token, entry = tokens.new_token(1000)
    listed = tokens.entries(tokens.with_token(BASE, "alice", entry))
    assert tokens.analyst_of(token, listed, 999.0) == "alice"
    assert entry.digest == hashlib.sha256(token.split("_", 2)[2].encode()).hexdigest()
    assert token.split("_", 2)[2] not in entry.text()  # the secret is never stored


@pytest.mark.parametrize("attack", ["forged", "expired", "unknown", "malformed", "other id"])
def test_forged_expired_unknown_or_malformed_tokens_name_no_one(attack: str) -> None:
    token, entry = tokens.new_token(1000)
    other, other_entry = tokens.new_token(1000)
    listed = tokens.entries(tokens.with_token(tokens.with_token(BASE, "alice", entry), "bob",
                                              other_entry))
    presented, now = {
        "forged": (token[:-1] + ("A" if token[-1] != "A" else "B"), 0.0),
        "expired": (token, 1000.0),  # expiry is exclusive: at 1000 it is over
        "unknown": (tokens.new_token(1000)[0], 0.0),
        "malformed": ("alice", 0.0),
        "other id": (f"dpb_{other_entry.id}_{token.split('_', 2)[2]}", 0.0),  # alice's secret
    }[attack]
    assert tokens.analyst_of(presented, listed, now) is None


def test_the_secret_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    token, entry = tokens.new_token(1000)
    listed = tokens.entries(tokens.with_token(BASE, "alice", entry))
    calls: list[tuple[str, str]] = []
    real = tokens.hmac.compare_digest
    monkeypatch.setattr(tokens.hmac, "compare_digest",
                        lambda a, b: calls.append((a, b)) or real(a, b))
    assert tokens.analyst_of(token, listed, 0.0) == "alice" and calls == [(entry.digest,
                                                                            entry.digest)]


def test_adding_a_token_is_a_grant_removing_one_is_not() -> None:
    _, entry = tokens.new_token(1000)
    added = tokens.with_token(BASE, "bob", entry)
    assert any("analysts.bob.tokens" in line for line in raised(document(BASE, None),
                                                                 document(added, None)))
    removed = tokens.without_token(added, entry.id)
    assert raised(document(added, None), document(removed, None)) == []
    with pytest.raises(InvalidArgumentError, match="token_id"):
        tokens.without_token(removed, entry.id)


def test_negative_control_an_undeclared_tokens_field_read_as_missing_hides_the_grant() -> None:
    """Without the empty default that a document lacking ``tokens`` stands for, adding the first
    token would compare ``None`` (all) with the new list, and not be listed as a grant."""
    from dpbudget.policies import stored

    _, entry = tokens.new_token(1000)
    added = document(tokens.with_token(BASE, "bob", entry), None)
    field = stored.AnalystLimit.model_fields["tokens"]
    assert stored._field("wider", None, False, None, added["policy"]["analysts"]["bob"]["tokens"],
                         "tokens") == []
    assert field.default == ()
