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
from tests.service._site import POLICY, make_site


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


def test_owner_link_is_a_cli_command(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The link is signed for the ledger identity the owner pins (``--ledger``, as ``dpbudget
    status`` prints it): no request asks the server which ledger it holds."""
    site = make_site(tmp_path)
    assert main(["status", site.ledger]) == 0
    assert f"identity {site.identity}" in capsys.readouterr().out
    assert main(["owner", "link", "http://127.0.0.1:9", "--owner-key", str(site.key),
                 "--ledger", site.identity]) == 0
    link = capsys.readouterr().out.strip()
    assert link.startswith("http://127.0.0.1:9/owner/status?t=") and "&s=" in link
    assert main(["owner", "link", "http://127.0.0.1:9", "--owner-key", str(site.key),
                 "--ledger", "not-an-identity"]) == 2


def test_the_public_url_is_given_or_derived_never_a_wildcard() -> None:
    args = argparse.Namespace(host="127.0.0.1", port=8443, cert="c.pem")
    assert run._derived_url(args) == "https://127.0.0.1:8443"
    for wildcard in ("0.0.0.0", "::"):
        with pytest.raises(PrivacyError, match="--public-url"):
            run._derived_url(argparse.Namespace(host=wildcard, port=80, cert=None))


def test_serve_checks_and_serves_one_ledger_opened_once(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``_open`` checks a ledger and hands that very object to the accountant: the ledger it
    serves is the one it checked, opened once (the old code reopened it by name)."""
    from dpbudget.accountant.ledger import SqliteLedger

    site = make_site(tmp_path)
    opened: list[object] = []
    real = SqliteLedger.__init__

    def counted(self: SqliteLedger, *args: object, **kwargs: object) -> None:
        opened.append(self)
        real(self, *args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(SqliteLedger, "__init__", counted)
    acc = run._open(str(site.folder / "policy.toml"), site.ledger)
    try:
        assert len(opened) == 1 and acc.ledger is opened[0]
    finally:
        acc.close()


@pytest.mark.postgres
def test_serve_on_an_empty_postgres_schema_is_refused_and_creates_no_table(
        postgres_database: str, tmp_path: Path) -> None:
    """The attack: ``serve`` on an empty PostgreSQL schema ran the DDL (made the tables) before
    refusing. Now refused with nothing created. The negative control: the same open allowed to
    create (as readers did before) makes the tables."""
    import psycopg

    from dpbudget.accountant.ledger.postgres import PostgresLedger
    from tests.conftest import _fresh_schema

    dsn = _fresh_schema(postgres_database)
    schema = dsn.rsplit("%3D", 1)[1]

    def tables() -> int:
        with psycopg.connect(postgres_database) as conn:
            row = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s",
                               (schema,)).fetchone()
            return int(row[0]) if row else -1
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("{alice}", "alice"))
    with pytest.raises(PrivacyError, match="does not exist"):
        run._open(str(policy), dsn)
    assert tables() == 0
    PostgresLedger(dsn).close()  # (create=True, the old path of every opener)
    assert tables() > 0
