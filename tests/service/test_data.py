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
