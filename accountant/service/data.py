"""The tables a query service holds: ``data.toml``, read once when the server starts.

::

    [tables.visits]                  # the name analysts query (wire.Query.table)
    dataset = "visits"               # the policy's dataset it is charged to
    source = "visits.parquet"        # a .parquet or .csv file, read through DuckDB (relative
                                     # to data.toml's folder; no glob characters *?[]{})

Invariant: a registered table names a dataset the policy declares with a privacy unit (the table
API refuses others when queried) and a source file that exists when the server starts; the
analyst never names the dataset or the file, only the table; and a source file is charged to
ONE dataset (under two, the same rows would have two budgets).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dpbudget.accountant.values.errors import PolicyError, from_validation_error

__all__ = ["Registered", "load_data"]


class Registered(NamedTuple):
    """One table: the ``dataset`` it is charged to and the ``source`` file it is read from."""

    dataset: str
    source: Path


class _Table(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    dataset: str = Field(min_length=1, max_length=255)
    source: str = Field(min_length=1)


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
        other = next((t for t, r in out.items() if r.source.samefile(source)
                      and r.dataset != table.dataset), None)
        if other is not None:  # (one file however reached: a second path, a link, a hard link)
            raise PolicyError(f"tables.{name}.source", f"is the source of tables.{other} under "
                              "another dataset: one file, one budget", str(file))
        out[name] = Registered(table.dataset, source)
    return out
