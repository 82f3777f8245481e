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
