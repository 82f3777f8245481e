"""Registered tables (dpbudget.accountant.service.data): a name, a dataset, a file that exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpbudget.accountant.service.data import load_data
from dpbudget.accountant.values.errors import PolicyError


def test_tables_resolve_beside_the_data_file(tmp_path: Path) -> None:
    (tmp_path / "v.csv").write_text("pid,x\n1,2\n")
    (tmp_path / "data.toml").write_text('[tables.v]\ndataset = "visits"\nsource = "v.csv"\n')
    found = load_data(tmp_path / "data.toml")
    assert found["v"].dataset == "visits" and found["v"].source == (tmp_path / "v.csv").resolve()


@pytest.mark.parametrize(("text", "match"), [
    ('[tables.v]\ndataset = "visits"\nsource = "missing.csv"\n', "no such file"),
    ('[tables.v]\ndataset = "visits"\nsource = "v.txt"\n', "parquet or .csv"),
    ('[tables.v]\ndataset = "visits"\nsource = "v.csv"\nanalyst = "bob"\n', "analyst"),
    ('[tables]\n', "tables"),
    ('[tables.v\n', "cannot read"),
])
def test_a_bad_data_file_is_refused_by_key(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "v.txt").write_text("x")
    (tmp_path / "v.csv").write_text("pid\n1\n")
    (tmp_path / "data.toml").write_text(text)
    with pytest.raises(PolicyError, match=match):
        load_data(tmp_path / "data.toml")


def test_one_source_under_two_datasets_is_refused(tmp_path: Path) -> None:
    """The attack: one file registered under two datasets, two budgets for the same rows —
    even through another spelling of its path or a link to it."""
    (tmp_path / "v.csv").write_text("pid,x\n1,2\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.csv").symlink_to(tmp_path / "v.csv")
    for other in ("v.csv", "sub/../v.csv", "link.csv"):
        (tmp_path / "data.toml").write_text(
            '[tables.a]\ndataset = "visits"\nsource = "v.csv"\n'
            f'[tables.b]\ndataset = "visits_again"\nsource = "{other}"\n')
        with pytest.raises(PolicyError, match="another dataset"):
            load_data(tmp_path / "data.toml")


def test_negative_control_one_source_under_one_dataset_twice_is_fine(tmp_path: Path) -> None:
    """Two tables of one source under the SAME dataset share its budget: served."""
    (tmp_path / "v.csv").write_text("pid,x\n1,2\n")
    (tmp_path / "data.toml").write_text('[tables.a]\ndataset = "visits"\nsource = "v.csv"\n'
                                        '[tables.b]\ndataset = "visits"\nsource = "v.csv"\n')
    assert set(load_data(tmp_path / "data.toml")) == {"a", "b"}


@pytest.mark.parametrize("name", ["v*.parquet", "v?.parquet", "v[12].parquet", "v{1,2}.parquet"])
def test_a_glob_source_is_refused(tmp_path: Path, name: str) -> None:
    """The reviewer's attack: a source named with glob characters (a file of that very name
    exists, so it passes the file check) is read by DuckDB as every file it matches — two
    datasets' files under one table. Refused by name."""
    import duckdb
    import pandas as pd

    for i in (1, 2):
        pd.DataFrame({"pid": [i, i]}).to_parquet(tmp_path / f"v{i}.parquet")
    pd.DataFrame({"pid": [9]}).to_parquet(tmp_path / name)
    (tmp_path / "data.toml").write_text(f'[tables.v]\ndataset = "visits"\nsource = "{name}"\n')
    with pytest.raises(PolicyError, match="one file"):
        load_data(tmp_path / "data.toml")
    if "{" in name:  # (refused too: this DuckDB does not expand braces; a later one may)
        return
    # The negative control: what the engine would read under that name — other files' rows.
    read = duckdb.connect().read_parquet(str(tmp_path / name)).df()["pid"].tolist()
    assert 1 in read and 2 in read


@pytest.mark.parametrize("name", ["V.PARQUET", "v.Parquet", "v.CSV"])
def test_a_suffix_not_exactly_parquet_or_csv_is_refused(tmp_path: Path, name: str) -> None:
    """``X.PARQUET`` passed a lowercased check, but the table reader picks Parquet only by the
    exact suffix: refused here, and the lowercase spelling is served (the control)."""
    (tmp_path / name).write_text("pid\n1\n")
    (tmp_path / "data.toml").write_text(f'[tables.v]\ndataset = "visits"\nsource = "{name}"\n')
    with pytest.raises(PolicyError, match="lowercase"):
        load_data(tmp_path / "data.toml")
    assert Path(name).suffix.lower() in (".parquet", ".csv")  # (what the old check accepted)
    (tmp_path / name.lower()).write_text("pid\n1\n")
    (tmp_path / "data.toml").write_text(
        f'[tables.v]\ndataset = "visits"\nsource = "{name.lower()}"\n')
    assert load_data(tmp_path / "data.toml")["v"].source.name == name.lower()
