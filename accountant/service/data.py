"""The tables a query service holds: ``data.toml``, read once when the server starts.

::

    [tables.visits]                  # the name analysts query (wire.Query.table)
    dataset = "visits"               # the policy's dataset it is charged to
    source = "visits.parquet"        # a .parquet or .csv file, read through DuckDB (relative
                                     # to data.toml's folder; no glob characters *?[]{})

    [tables.trips]                   # or a PostgreSQL table (instead of source):
    dataset = "trips"
    postgres = "postgresql://reader@db.internal/warehouse"   # a libpq DSN (never shown whole:
    table = "public.trips"           # its password is left out of every message and log line)

A PostgreSQL table is checked when the server starts (the DSN connects, the table exists, its
columns are listed); each query reads only the columns it names, in one read-only REPEATABLE
READ transaction (one version of them), into an in-memory Arrow table that the table API reads
through DuckDB, as it does a file.

Invariant: a registered table names a dataset the policy declares with a privacy unit (the table
API refuses others when queried) and a source that exists when the server starts; the analyst
never names the dataset, the file or the database table, only the registered name; and a source
(a file, or a table of one database) is charged to ONE dataset (under two, the same rows would
have two budgets).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dpbudget.accountant.values.errors import (PolicyError, ServiceError,
                                               from_validation_error)

__all__ = ["Postgres", "Registered", "load_data", "read_postgres"]


class Postgres(NamedTuple):
    """A PostgreSQL table: the ``dsn`` to reach it, its ``schema`` and ``name`` (as the
    database spells them), its ``columns``, and ``key`` (server, database and table oid: the
    same table however the DSN or the name is written)."""

    dsn: str
    schema: str
    name: str
    columns: tuple[str, ...]
    key: tuple[Any, ...]

    def __repr__(self) -> str:  # (never the DSN: it may hold a password)
        return f"Postgres({self.schema}.{self.name})"


class Registered(NamedTuple):
    """One table: the ``dataset`` it is charged to and the ``source`` it is read from (a file,
    or a PostgreSQL table)."""

    dataset: str
    source: Path | Postgres


class _Table(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    dataset: str = Field(min_length=1, max_length=255)
    source: str | None = Field(default=None, min_length=1)
    postgres: str | None = Field(default=None, min_length=1)
    table: str | None = Field(default=None, min_length=1)


class _File(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    tables: dict[str, _Table] = Field(min_length=1)


def load_data(path: str | Path) -> dict[str, Registered]:
    """The tables ``path`` registers, by name.

    Raises:
        PolicyError: the file cannot be read or parsed, has another shape, names a source that
            holds a glob character or is not a .parquet or .csv file (a lowercase suffix), or
            one that does not exist, or a source already registered under another dataset (the
            key path named).
    """
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
        tables = _File.model_validate(raw).tables
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError("", f"cannot read the data file ({type(exc).__name__})",
                          str(file)) from None
    except ValidationError as exc:
        raise PolicyError("", str(from_validation_error(exc)), str(file)) from None
    out: dict[str, Registered] = {}
    for name, table in tables.items():
        if (table.source is None) == (table.postgres is None) or (
                (table.postgres is None) != (table.table is None)):
            raise PolicyError(f"tables.{name}", "must give source, or postgres and table",
                              str(file))
        if table.postgres is not None and table.table is not None:
            pg = _postgres(table.postgres, table.table, f"tables.{name}", str(file))
            other = next((t for t, r in out.items() if isinstance(r.source, Postgres)
                          and r.source.key == pg.key and r.dataset != table.dataset), None)
            if other is not None:
                raise PolicyError(f"tables.{name}.table", f"is the source of tables.{other} "
                                  "under another dataset: one table, one budget", str(file))
            out[name] = Registered(table.dataset, pg)
            continue
        assert table.source is not None
        # (DuckDB reads a glob as every file it matches: one name, one file)
        if any(c in table.source for c in "*?[]{}"):
            raise PolicyError(f"tables.{name}.source", "must name one file: no *?[]{} "
                              "characters", str(file))
        source = (file.parent / table.source).resolve()
        # (exactly: the reader picks Parquet by this suffix and reads any other as CSV)
        if source.suffix not in (".parquet", ".csv"):
            raise PolicyError(f"tables.{name}.source", "must end in .parquet or .csv "
                              "(lowercase)", str(file))
        if not source.is_file():
            raise PolicyError(f"tables.{name}.source", "no such file", str(file))
        other = next((t for t, r in out.items() if isinstance(r.source, Path)
                      and r.source.samefile(source)
                      and r.dataset != table.dataset), None)
        if other is not None:  # (one file however reached: a second path, a link, a hard link)
            raise PolicyError(f"tables.{name}.source", f"is the source of tables.{other} under "
                              "another dataset: one file, one budget", str(file))
        out[name] = Registered(table.dataset, source)
    return out


def _postgres(dsn: str, table: str, where: str, file: str) -> Postgres:
    """The PostgreSQL table ``table`` (``schema.name`` or ``name``, as SQL spells it) at ``dsn``,
    checked: it connects and the table exists. Errors name the class, never the DSN's text."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=10) as con:
            row = con.execute(
                "SELECT n.nspname, c.relname, c.oid::bigint, current_database(),"
                " coalesce(inet_server_addr()::text, ''), coalesce(inet_server_port(), 0),"
                " array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid"
                "       AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum)"
                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.oid = to_regclass(%s)", (table,)).fetchone()
    except psycopg.Error as exc:  # (its message may quote the DSN: only the class is shown)
        raise PolicyError(f"{where}.postgres", f"cannot connect or read the catalog "
                          f"({type(exc).__name__})", file) from None
    if row is None:
        raise PolicyError(f"{where}.table", "no such table in that database", file)
    schema, name, oid, database, host, port, columns = row
    return Postgres(dsn, schema, name, tuple(columns), (host, port, database, oid))


def read_postgres(source: Postgres, columns: list[str]) -> Any:
    """The ``columns`` of ``source`` (those it has: another name is refused by the table API,
    by name), read once into memory as a DuckDB relation on a connection of its own.

    Raises:
        ServiceError: 503, the database could not be read (its class shown, not its message).
    """
    import duckdb
    import psycopg
    import pyarrow as pa
    from psycopg import sql

    wanted = [c for c in dict.fromkeys(columns) if c in source.columns]
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in wanted),
        sql.Identifier(source.schema, source.name))
    try:
        with psycopg.connect(source.dsn, connect_timeout=10) as con:
            con.read_only = True
            con.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ  # (one version)
            rows = con.execute(query).fetchall()
    except psycopg.Error as exc:
        raise ServiceError(503, f"the table's PostgreSQL source could not be read "
                           f"({type(exc).__name__}); nothing was drawn or debited") from None
    arrow = pa.table({c: pa.array([r[i] for r in rows]) for i, c in enumerate(wanted)})
    return duckdb.connect().from_arrow(arrow)
