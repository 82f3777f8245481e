"""Shared fixtures: the ledger backends every ledger-facing test runs against, seeded RNGs, and the
snapshot helper used to prove that a refused or malformed request changed nothing.

Adding a ledger backend is one line in ``LEDGER_BACKENDS``: a name mapped to a factory that takes
pytest's ``tmp_path`` and the fixture request and returns an *opener*: a callable (keyword arguments
are passed to the backend's constructor, e.g. ``hmac_key``) that opens a handle on the same, fresh
storage each time it is called, so persistence can be tested by re-opening. A backend that needs a
server is wrapped in ``pytest.param(..., marks=...)`` (PostgreSQL: ``pytest.mark.postgres``,
with the server started once per session by the ``postgres_server`` fixture).
"""

from __future__ import annotations

import json
import os
import textwrap
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import settings

from dpbudget.accountant.ledger import Ledger, MemoryLedger, SqliteLedger
from tests.support import SEED

Opener = Callable[..., Ledger]

# When a property test fails, hypothesis's pytest plugin imports its patch writer, which imports
# libcst, which (with some mypy_extensions versions) emits a DeprecationWarning at import time.
# Under ``filterwarnings = error`` that warning escapes from a report hook as an INTERNALERROR and
# aborts the whole run instead of reporting the one failure. Import it once here, quietly.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import hypothesis.extra._patching  # noqa: F401
    except Exception:  # pragma: no cover - libcst absent: hypothesis then skips patching itself
        pass

# Property tests are reproducible in CI (derandomized, no example database written into the
# checkout); set HYPOTHESIS_PROFILE=explore locally to search with fresh random examples.
settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          print_blob=True)
settings.register_profile("explore", database=None, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _memory(tmp_path: Path, request: pytest.FixtureRequest) -> Opener:
    made: list[MemoryLedger] = []

    def opener(**kwargs: Any) -> MemoryLedger:
        # The storage *is* the object: the first call creates it, re-opening returns it.
        if not made:
            made.append(MemoryLedger(**kwargs))
        return made[0]

    return opener


def _sqlite(tmp_path: Path, request: pytest.FixtureRequest) -> Opener:
    return lambda **kwargs: SqliteLedger(tmp_path / "ledger.db", **kwargs)


def _postgres(tmp_path: Path, request: pytest.FixtureRequest) -> Opener:
    from dpbudget.accountant.ledger.postgres import PostgresLedger

    dsn = _fresh_schema(request.getfixturevalue("postgres_database"))
    return lambda **kwargs: PostgresLedger(dsn, **kwargs)


def _fresh_schema(database_dsn: str) -> str:
    """A new, empty schema in the test database, as a DSN whose search_path points at it: a fresh
    ledger in ~10 ms (CREATE DATABASE takes ~0.5 s, which over every ledger test is too slow)."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return f"{database_dsn}?options=-csearch_path%3D{name}"


LEDGER_BACKENDS: dict[str, Any] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "postgres": pytest.param(_postgres, marks=pytest.mark.postgres),
}


def _backend_params(names: Any = None) -> list[Any]:
    out = []
    for name, factory in LEDGER_BACKENDS.items():
        if names is not None and name not in names:
            continue
        if isinstance(factory, type(pytest.param(None))):
            out.append(pytest.param(*factory.values, marks=factory.marks, id=name))
        else:
            out.append(pytest.param(factory, id=name))
    return out


@pytest.fixture(params=_backend_params())
def ledger_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """An opener for a fresh, empty ledger of each registered backend; handles are closed after
    the test."""
    with _tracked_opener(request, tmp_path) as opener:
        yield opener


@pytest.fixture(params=_backend_params(("memory", "sqlite")))
def embedded_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Ledger:
    """A fresh in-memory or SQLite ledger: for the large matrices of accountant tests, which are
    about the gate rather than the backend (every backend passes ``LedgerContract`` and the
    accountant tests that take ``ledger``)."""
    with _tracked_opener(request, tmp_path) as opener:
        yield opener()


@contextmanager
def _tracked_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opener = request.param(tmp_path, request)
    opened: list[Ledger] = []

    def tracked(**kwargs: Any) -> Ledger:
        ledger = opener(**kwargs)
        opened.append(ledger)
        return ledger

    try:
        yield tracked
    finally:
        for ledger in opened:
            ledger.close()


@pytest.fixture(scope="session")
def postgres_server() -> Any:
    """The DSN of a throw-away PostgreSQL server (``tests/_postgres.py``), started once per session
    on first use. Skipped locally when the binaries or psycopg are missing; a failure under CI."""
    from tests import _postgres

    reason = _postgres.available()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    with _postgres.server() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def postgres_database(postgres_server: str) -> str:
    """One database for the session's ledger tests; each test gets its own schema in it."""
    from tests import _postgres

    return _postgres.fresh_database(postgres_server)


@pytest.fixture(scope="session")
def spark() -> Any:
    """A local SparkSession (``tests/_spark.py``), started once per session on first use and
    stopped at its end. Skipped locally when pyspark or Java is missing; a failure under CI."""
    from tests import _spark

    reason = _spark.available()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    session = _spark.session()
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _no_ledger_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose their own HMAC key; one set in the developer's environment must not leak in."""
    monkeypatch.delenv("DPBUDGET_LEDGER_KEY", raising=False)


@pytest.fixture
def ledger(ledger_opener: Opener) -> Ledger:
    """A fresh, empty ledger of each registered backend."""
    return ledger_opener()


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator, to pass as ``rng=`` and compare ``rng.bit_generator.state``."""
    return np.random.default_rng(SEED)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Contract classes declare their cases as data; this turns them into parametrized tests."""
    cls = metafunc.cls
    if cls is None:
        return
    for fixture, attribute in (("bad_construction", "bad_constructions"),
                               ("bad_value", "bad_values")):
        if fixture in metafunc.fixturenames:
            cases = getattr(cls, attribute)()
            metafunc.parametrize(fixture, cases)


@pytest.fixture
def write(tmp_path: Path):
    """``write(text, suffix=".toml")`` -> the path of a new policy file with ``text``."""
    counter = iter(range(10_000))

    def _write(text: str | dict, suffix: str = ".toml") -> Path:
        path = tmp_path / f"policy{next(counter)}{suffix}"
        body = json.dumps(text) if isinstance(text, dict) else textwrap.dedent(text)
        path.write_text(body, encoding="utf-8")
        return path
    return _write
