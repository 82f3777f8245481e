"""Policy changes need the ledger owner's key (issue 28), each hole written as the attack.

Measured on the code before owner keys: anyone holding an ``Accountant`` called ``apply_policy``
with a self-declared ``by``, took the owner's ε = 1 to 100, and the audit exited 0, listing no
policy record; a block division changed from ``by = "day"`` to ``"hour"`` re-opened a spent day
(it took 1.0 more).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, LedgerCorruptedError
from dpbudget.accountant.gate import policy_record
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.audit.text import audit_text
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.values.errors import OwnerKeyError
from dpbudget.accountant.ledger import Account, open_ledger
from dpbudget.accountant.ledger.record import ZERO_COST, canonical
from dpbudget.accountant.gate.owner_key import OwnerKey, new_key_file, signed_text, verify
from dpbudget.mechanisms import Laplace
from dpbudget.policies.policy import Policy
from dpbudget.policies.stored import POLICY_KEY, document
from tests.support import OWNER, import_one_release, set_ledger_clock, snapshot

ONE = Policy.model_validate({"datasets": {"people": {"limit": {"epsilon": 1.0}}}})
HUNDRED = Policy.model_validate({"datasets": {"people": {"limit": {"epsilon": 100.0}}}})


def _url(tmp_path: Path, name: str = "l.db") -> str:
    return f"sqlite:///{tmp_path / name}"


def _keyed(tmp_path: Path, name: str = "l.db") -> str:
    """A ledger the owner created with ε = 1, on which the analyst spent it all."""
    url = _url(tmp_path, name)
    with Accountant.from_policy(ONE, ledger=url, owner_key=OWNER) as acc:
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="people")
    return url


def _forge(url: str, policy: Policy, members: dict[str, str] | None = None) -> int:
    """Append a policy record the way the code before owner keys did (unsigned), or with
    ``members`` added (a signature of the attacker's choosing), through the ledger's own
    transaction: what anyone who can run code against the ledger can write."""
    with open_ledger(url) as ledger:
        with ledger.transaction() as tx:
            fields = {"kind": '"policy"', "policy": canonical(document(policy, None)),
                      "by": '"analyst"', "reason": '"more"', "cost": ZERO_COST,
                      "accounts": canonical({POLICY_KEY: {"rule": "policy", "state": {}}}),
                      **(members or {})}
            return tx.append(fields, [Account(POLICY_KEY, "policy", {}, {}, 0)]).seq


def _record(url: str, seq: int) -> dict[str, Any]:
    with open_ledger(url, create=False) as ledger:
        entry = ledger.entry(seq)
        assert entry is not None
        return json.loads(entry.text)  # type: ignore[no-any-return]


def _texts(url: str) -> list[str]:
    with open_ledger(url, create=False) as ledger:
        return [e.text for e in ledger.entries()]


def _other_key() -> OwnerKey:
    return OwnerKey(Ed25519PrivateKey.generate())


def test_apply_policy_without_the_owners_key_is_refused_and_changes_nothing(
        tmp_path: Path) -> None:
    url = _keyed(tmp_path)
    with Accountant.open(url) as analyst:
        before = snapshot(analyst.ledger)
        for key in (None, _other_key()):  # no key; the analyst's own key
            with pytest.raises(OwnerKeyError, match="nothing was written"):
                analyst.apply_policy(HUNDRED, by="owner", reason="more", owner_key=key)
        assert snapshot(analyst.ledger) == before
        with pytest.raises(BudgetExceededError):  # ε = 1 spent: still refused
            analyst.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="people")
    assert audit(url).ok
    # Negative control: the owner's key makes the same change, recorded as granting more.
    with Accountant.open(url) as owner:
        change = owner.apply_policy(HUNDRED, by="owner", reason="more", owner_key=OWNER)
        assert change.raised == ["policy.datasets.people.limit.epsilon: 1.0 -> 100.0"]
        owner.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="people")
    assert audit(url).ok


def test_policy_apply_on_the_command_line_needs_the_owners_key_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _keyed(tmp_path)
    hundred = tmp_path / "hundred.toml"
    hundred.write_text("[datasets.people]\nlimit = { epsilon = 100.0 }\n")
    monkeypatch.delenv("DPBUDGET_OWNER_KEY", raising=False)
    before = _texts(url)
    assert cli(["policy", "apply", str(hundred), url, "--reason", "more"]) == 2
    stranger = tmp_path / "stranger.pem"
    new_key_file(stranger)
    assert cli(["policy", "apply", str(hundred), url, "--reason", "more",
                "--owner-key", str(stranger)]) == 2
    assert _texts(url) == before
    owner = tmp_path / "owner.pem"  # negative control: the owner's key file, named by the env
    public = new_key_file(owner)
    keyed = _url(tmp_path, "k.db")
    Accountant.from_policy(ONE, ledger=keyed, owner_key=owner).close()
    monkeypatch.setenv("DPBUDGET_OWNER_KEY", str(owner))
    assert cli(["policy", "apply", str(hundred), keyed, "--reason", "more"]) == 0
    assert _record(keyed, 1)["owner"] == public and "sig" in _record(keyed, 2)


@pytest.mark.parametrize("how", ["unsigned", "another key"])
def test_a_forged_policy_record_is_refused_at_open_and_flagged_by_the_audit(
        tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = _keyed(tmp_path)
    assert audit(url).ok  # negative control: the genuine ledger audits clean
    members = None
    if how == "another key":  # signed in its place, by a key the ledger does not pin
        stranger = _other_key()
        signed = {"by": "analyst", "reason": "more", "policy": document(HUNDRED, None)}
        with open_ledger(url, create=False) as ledger:
            first = ledger.entry(1)
            assert first is not None
            text = signed_text(json.loads(canonical(signed)), 3, stranger.public, first.hash)
        members = {"sig": canonical(stranger.sign(text))}
    seq = _forge(url, HUNDRED, members)
    assert seq == 3
    with pytest.MonkeyPatch.context() as old:  # negative control: without the check, it grants
        old.setattr(policy_record, "_not_the_owners", lambda *args: None)
        with Accountant.open(url) as analyst:
            assert analyst.remaining("people") == Budget(99.0)
    for opening in (lambda: Accountant.open(url), lambda: Accountant.from_policy(HUNDRED,
                                                                                 ledger=url)):
        with pytest.raises(LedgerCorruptedError, match="policy record 3"):
            opening()
    report = audit(url)
    assert report.exit_status & EXIT_BITS["policy"]
    assert [p.seq for p in report.problems if p.kind == "policy"] == [3]
    assert cli(["audit", url]) & 4
    assert "[policy] policy record 3" in capsys.readouterr().out


def test_the_keyless_ledgers_policy_cannot_change(tmp_path: Path) -> None:
    url = _url(tmp_path)
    with Accountant(Budget(1.0), ledger=url) as acc:
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="people")
        before = snapshot(acc.ledger)
        for key in (None, OWNER):
            with pytest.raises(OwnerKeyError):
                acc.apply_policy(HUNDRED, by="owner", reason="more", owner_key=key)
        assert snapshot(acc.ledger) == before
    with pytest.raises(OwnerKeyError, match="pins no owner key"):  # a key cannot be added later
        Accountant(Budget(1.0), ledger=url, owner_key=OWNER)
    # The old, unsigned path re-created: refused at open, flagged by the audit.
    _forge(url, HUNDRED)
    with pytest.MonkeyPatch.context() as old:  # negative control: without the check, it grants
        old.setattr(policy_record, "_not_the_owners", lambda *args: None)
        with Accountant.open(url) as analyst:
            assert analyst.remaining("people") == Budget(99.0)
    with pytest.raises(LedgerCorruptedError, match="pins no owner key"):
        Accountant.open(url)
    report = audit(url)
    assert report.exit_status & EXIT_BITS["policy"], report.problems


def test_an_old_signed_record_replayed_later_is_refused(tmp_path: Path) -> None:
    url = _keyed(tmp_path)
    with Accountant.open(url) as owner:
        owner.apply_policy(HUNDRED, by="owner", reason="a trial", owner_key=OWNER)  # seq 3
        owner.apply_policy(ONE, by="owner", reason="trial over", owner_key=OWNER)  # seq 4
    granted = _record(url, 3)
    members = {"by": canonical(granted["by"]), "reason": canonical(granted["reason"]),
               "sig": canonical(granted["sig"])}
    assert _forge(url, HUNDRED, members) == 5  # the trial's record, copied to the end
    with pytest.raises(LedgerCorruptedError, match="policy record 5"):
        Accountant.open(url)
    assert [p.seq for p in audit(url).problems if p.kind == "policy"] == [5]
    # Negative control: the copy's signature is the owner's own; only its place differs.
    with open_ledger(url, create=False) as ledger:
        first = ledger.entry(1)
        assert first is not None
        assert verify(_record(url, 5), 3, OWNER.public, first.hash) is None
        assert verify(_record(url, 5), 5, OWNER.public, first.hash) is not None
    # Into another ledger of the same owner, at the same seq: its identity differs.
    other = _keyed(tmp_path, "other.db")
    assert _forge(other, HUNDRED, members) == 3
    with pytest.raises(LedgerCorruptedError, match="policy record 3"):
        Accountant.open(other)


def test_the_audit_lists_every_policy_record(tmp_path: Path) -> None:
    url = _keyed(tmp_path)
    with Accountant.open(url) as owner:
        owner.apply_policy(HUNDRED, by="carol", reason="quarterly review", owner_key=OWNER)
    report = audit(url)
    assert report.ok and report.owner == OWNER.public
    assert [(p.seq, p.by, p.reason, p.signed) for p in report.policies] == [
        (1, policy_record.actor(), "created", True), (3, "carol", "quarterly review", True)]
    assert report.policies[1].raised == ["policy.datasets.people.limit.epsilon: 1.0 -> 100.0"]
    assert all(p.time for p in report.policies)
    text = audit_text(report, None)
    assert "record 3" in text and "by carol: quarterly review" in text
    assert "grants more: policy.datasets.people.limit.epsilon: 1.0 -> 100.0" in text


def test_a_new_block_length_re_opens_spent_blocks_only_with_the_owners_key_and_is_listed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    daily = Policy.model_validate({"datasets": {"events": {"limit": {"epsilon": 100.0}, "blocks": {
        "by": "day", "limit": {"epsilon": 1.0}}}}})
    hourly = Policy.model_validate({"datasets": {"events": {"limit": {"epsilon": 100.0}, "blocks": {
        "by": "hour", "limit": {"epsilon": 1.0}}}}})
    url = _url(tmp_path)
    now = 1_795_255_200.0  # 2026-11-21T10:00Z: a fixed instant
    set_ledger_clock(lambda: now, monkeypatch)  # (the SQLite ledger's wall clock)
    acc = Accountant.from_policy(daily, ledger=url, owner_key=OWNER)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")  # the day: spent
    with pytest.raises(OwnerKeyError):
        acc.apply_policy(hourly, by="analyst", reason="finer blocks")
    with pytest.raises(BudgetExceededError):
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")
    change = acc.apply_policy(hourly, by="owner", reason="finer blocks", owner_key=OWNER)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20T05")  # the owner's grant
    acc.close()
    listed = audit(url).policies[-1]
    assert listed.raised == change.raised and any("blocks.by" in r and "budget again" in r
                                                  for r in listed.raised)


def test_keys_new_writes_a_0600_file_and_never_prints_the_private_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "owner.pem"
    assert cli(["keys", "new", str(path)]) == 0
    out = capsys.readouterr()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    pem = path.read_text()
    body = "".join(pem.strip().splitlines()[1:-1])
    assert "PRIVATE KEY" in pem and body not in out.out + out.err and "PRIVATE" not in out.out
    public = out.out.split("public key: ")[1].strip()
    Accountant.from_policy(ONE, ledger=_url(tmp_path), owner_key=path).close()
    assert _record(_url(tmp_path), 1)["owner"] == public
    assert cli(["keys", "new", str(path)]) == 2  # never overwritten
    assert path.read_text() == pem
    assert repr(OWNER) == f"OwnerKey(public={OWNER.public!r})"


def test_a_keyed_ledger_without_cryptography_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _keyed(tmp_path)
    # As if not installed: the module cannot be imported (nor found on its loaded package).
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.asymmetric.ed25519", None)
    monkeypatch.delattr(sys.modules["cryptography.hazmat.primitives.asymmetric"], "ed25519")
    with pytest.raises(OwnerKeyError, match=r"dpbudget\[owner\]"):
        Accountant.open(url)
    plain = _url(tmp_path, "plain.db")
    with Accountant(Budget(1.0), ledger=plain) as acc:  # a keyless ledger needs no cryptography
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    with Accountant.open(plain) as acc:
        assert acc.remaining() == Budget(0.5)


def test_policy_apply_init_creates_a_keyed_ledger_on_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPBUDGET_OWNER_KEY", raising=False)
    policy = tmp_path / "one.toml"
    policy.write_text("[datasets.people]\nlimit = { epsilon = 1.0 }\n")
    key = tmp_path / "owner.pem"
    public = new_key_file(key)
    url = _url(tmp_path)
    assert cli(["policy", "apply", str(policy), url, "--init"]) == 2  # no key: nothing created
    assert not (tmp_path / "l.db").exists()
    assert cli(["policy", "apply", str(policy), url, "--init", "--owner-key", str(key)]) == 0
    assert public in capsys.readouterr().out and _record(url, 1)["owner"] == public
    assert cli(["policy", "apply", str(policy), url, "--init", "--owner-key", str(key)]) == 2
    with Accountant.open(url) as acc:
        assert acc.remaining("people") == Budget(1.0)
    with pytest.raises(SystemExit):  # a change still needs its reason
        cli(["policy", "apply", str(policy), url, "--owner-key", str(key)])


def test_a_ledger_from_before_stored_policies_keeps_the_policy_it_adopts(tmp_path: Path) -> None:
    url = _url(tmp_path)
    import_one_release(url, tmp_path, 0.5)  # records no policy: like a ledger from before them
    with pytest.raises(OwnerKeyError, match="pins no owner key"):  # record 1 pins none
        Accountant(Budget(1.0), ledger=url, owner_key=OWNER)
    with Accountant(Budget(1.0), ledger=url) as acc:  # adopts its recorded limits (record 2)
        with pytest.raises(OwnerKeyError, match="pins no owner key"):
            acc.apply_policy(HUNDRED, by="owner", reason="more", owner_key=OWNER)
    with Accountant.open(url) as acc:
        assert acc.remaining("people") == Budget(0.5)
    assert _forge(url, HUNDRED) == 3  # a second policy record, unsigned: refused, flagged
    with pytest.raises(LedgerCorruptedError, match="policy record 3"):
        Accountant.open(url)
    assert [p.seq for p in audit(url).problems if p.kind == "policy"] == [3]
