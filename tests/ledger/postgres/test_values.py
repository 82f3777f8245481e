"""The PostgreSQL ledger sends each debit's values as bound parameters: names, labels and record
texts that look like SQL are stored verbatim and change nothing else; a NUL character is refused
before anything is written; the session speaks UTF-8 whatever the environment says."""

from __future__ import annotations

import pytest

from dpbudget.accountant import Accountant, Budget, LedgerError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.mechanisms import Laplace
from tests.conftest import _fresh_schema

pytestmark = pytest.mark.postgres

HOSTILE = ["it's", "'); DROP TABLE dpbudget_entries; --", "back\\slash\\'", "%s %(x)s %%",
           "E'\\x27'", "$$ dollar $$", "émoji ✓ \u2028", "semi;colon", "\"quoted\""]


def test_hostile_labels_and_names_are_stored_verbatim(postgres_database: str) -> None:
    dsn = _fresh_schema(postgres_database)
    acc = Accountant(Budget(10.0), ledger=dsn, rng=0, simulation=True)
    for i, text in enumerate(HOSTILE):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=f"d{i}", label=text)
    labels = [e.record.get("label") for e in acc.ledger.entries()
              if e.record["kind"] == "release"]
    assert labels == HOSTILE
    assert audit(acc.ledger).ok
    assert len([a for a in acc.ledger.accounts() if a.key.startswith("dataset:")]) == len(HOSTILE)
    acc.close()


def test_a_nul_character_is_refused_before_anything_is_written(postgres_database: str) -> None:
    acc = Accountant(Budget(1.0), ledger=PostgresLedger(_fresh_schema(postgres_database)),
                     rng=0, simulation=True)
    head = acc.ledger.head()
    with pytest.raises(LedgerError):  # (the server cannot store it in its JSON checks)
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, label="a\0b")
    assert acc.ledger.head() == head and acc.spent().epsilon == 0.0
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # nothing left locked or open
    acc.close()


def test_the_session_speaks_utf8_whatever_the_environment_says(
        postgres_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a client encoding in which a UTF-8 byte can swallow the next backslash, a label
    would be stored altered and a keyed ledger would then refuse to open for everyone."""
    monkeypatch.setenv("PGCLIENTENCODING", "SJIS")
    dsn = _fresh_schema(postgres_database)
    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    for label in ["語\\u0041", "ünïcödé \\ back", "Ω\\\\"]:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, label=label)
    acc.close()
    again = Accountant.open(dsn, rng=0, simulation=True)  # the stored texts are the hashed ones
    labels = [e.record.get("label") for e in again.ledger.entries()
              if e.record["kind"] == "release"]
    assert labels == ["語\\u0041", "ünïcödé \\ back", "Ω\\\\"]
    assert audit(again.ledger).ok
    again.close()


def test_a_schema_name_is_filled_in_once_never_read_again_for_placeholders() -> None:
    """The DDL template was filled by chained replaces, ``{S_LITERAL}`` before ``{S}``: a schema
    named ``a{S}'); ...`` had its ``{S}`` replaced again inside the string literal, ending it
    early, and ``ledger{V}`` became ``"ledger9"`` (review of the one-package ledger)."""
    from dpbudget.accountant.ledger.postgres.schema import ddl

    text = ddl("ledger{V}")
    assert '"ledger{V}"' in text and '"ledger9"' not in text
    evil = "a{S}'); DROP TABLE victim; --"
    text = ddl(evil)
    assert "'\"a{S}''); DROP TABLE victim; --\"'" in text  # one literal, quotes doubled
    assert text.count("DROP TABLE victim") == text.count('"a{S}\'); DROP TABLE victim; --"') + \
        text.count("'\"a{S}''); DROP TABLE victim; --\"'")


def test_the_ledger_never_shows_a_password() -> None:
    """``url`` appears in errors, ``dpbudget status``, report captions and the writers' logs; a
    DSN's password stayed in it (review of the one-package ledger)."""
    from dpbudget.accountant.ledger.postgres.session import shown

    for dsn in ("postgresql://bob:s3cret@db.example:5432/ledger?sslmode=require",
                "host=db.example user=bob password=s3cret dbname=ledger",
                "host=db.example user=bob sslpassword=s3cret dbname=ledger"):
        assert "s3cret" not in shown(dsn) and "bob" in shown(dsn)
    assert shown("postgresql://bob@db.example/ledger") == "postgresql://bob@db.example/ledger"


def test_a_schema_name_that_could_end_a_dollar_quote_is_refused() -> None:
    """The server functions' bodies are dollar-quoted (``DO $logged$ ... $logged$``): a schema
    named with ``$logged$`` closed one early (review of the one-package ledger)."""
    from dpbudget.accountant.ledger.postgres.schema import ddl
    from dpbudget.accountant.values.errors import LedgerError

    with pytest.raises(LedgerError):
        ddl("a$logged$b")
    assert '"plain"' in ddl("plain")
