"""``dpbudget token issue|revoke`` and ``dpbudget serve``'s opening (dpbudget.accountant.service.run):
a token is printed once and only its hash stored, by a policy record signed with the owner key
(none without it); the server refuses a policy file other than the one stored."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dpbudget.accountant.cli import main
from dpbudget.accountant.gate import policy_record
from dpbudget.accountant.ledger import open_ledger
from dpbudget.accountant.service import run
from dpbudget.accountant.service.tokens import analyst_of, entries
from dpbudget.accountant.values.errors import PrivacyError
from tests.service._site import make_site


def test_issue_prints_the_token_once_and_stores_its_hash(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    site = make_site(tmp_path)
    assert main(["token", "issue", site.ledger, "--analyst", "carol", "--owner-key",
                 str(site.key)]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    policy, _ = policy_record.stored_policy(site.ledger)
    assert analyst_of(token, entries(policy), 0.0) == "carol"
    with open_ledger(site.ledger, create=False) as ledger:
        assert all(token.split("_", 2)[2] not in e.text for e in ledger.entries())
    assert main(["token", "revoke", site.ledger, token.split("_")[1], "--owner-key",
                 str(site.key)]) == 0
    assert analyst_of(token, entries(policy_record.stored_policy(site.ledger)[0]), 0.0) is None


def test_issue_without_the_owner_key_writes_nothing(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    site = make_site(tmp_path)
    monkeypatch.delenv("DPBUDGET_OWNER_KEY", raising=False)
    with open_ledger(site.ledger, create=False) as ledger:
        before = ledger.head()
    assert main(["token", "issue", site.ledger, "--analyst", "alice"]) == 2
    with open_ledger(site.ledger, create=False) as ledger:
        assert ledger.head() == before


def test_serve_refuses_a_policy_file_other_than_the_stored_one(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    looser = tmp_path / "looser.toml"
    looser.write_text((site.folder / "policy.toml").read_text().replace("0.3", "3.0"))
    with pytest.raises(PrivacyError, match="not the policy stored"):
        run._open(str(looser), site.ledger)
    acc = run._open(str(site.folder / "policy.toml"), site.ledger)  # tokens aside: the same
    assert acc.remaining("visits", analyst="alice").epsilon == 0.3
    acc.close()


def test_serve_needs_cert_and_key_together(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    args = argparse.Namespace(cert="c.pem", key=None, data=str(site.folder / "data.toml"))
    with pytest.raises(PrivacyError, match="--cert and --key"):
        run.serve(args)


def test_serve_never_creates_a_ledger(tmp_path: Path) -> None:
    """The attack: ``dpbudget serve`` on a new ledger made it with no owner key pinned, so its
    tokens could never be revoked. Now a missing ledger is refused, naming the init command,
    and no file is made."""
    site = make_site(tmp_path)
    missing = tmp_path / "new.db"
    with pytest.raises(PrivacyError, match="policy apply .* --init --owner-key"):
        run._open(str(site.folder / "policy.toml"), f"sqlite:///{missing}")
    assert not missing.exists()


def test_serve_refuses_a_ledger_that_pins_no_owner_key(tmp_path: Path) -> None:
    """A ledger made without the owner key (as the old serve made it) is refused; the same
    policy on the site's ledger, which pins one, opens (the control)."""
    import dpbudget as dp

    site = make_site(tmp_path)
    ownerless = f"sqlite:///{tmp_path / 'ownerless.db'}"
    dp.Accountant.from_policy(site.folder / "policy.toml", ledger=ownerless).close()
    with pytest.raises(PrivacyError, match="pins no owner key"):
        run._open(str(site.folder / "policy.toml"), ownerless)
    run._open(str(site.folder / "policy.toml"), site.ledger).close()


def test_owner_link_is_a_cli_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from dpbudget.accountant.service.client import Owner

    site = make_site(tmp_path)
    monkeypatch.setattr(Owner, "_identity", lambda self: "ab" * 32)
    assert main(["owner", "link", "http://127.0.0.1:9", "--owner-key", str(site.key)]) == 0
    link = capsys.readouterr().out.strip()
    assert link.startswith("http://127.0.0.1:9/owner/status?t=") and "&s=" in link
