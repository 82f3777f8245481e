"""Ledgers the audit's tests read (importable as ``tests.audit.support``)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.transfer import export_jsonl
from dpbudget.accountant.ledger import open_ledger
from dpbudget.mechanisms import Laplace


def six_releases(path: Path, n: int = 6, **kw: Any) -> str:
    """An SQLite ledger at ``path`` with ``n`` releases on two datasets by two analysts (seeded:
    a simulation ledger); its URL."""
    url = f"sqlite:///{path}"
    with Accountant(limits={"adult": Budget(1.0, 1e-6), "census": Budget(2.0)}, ledger=url,
                    rng=1, simulation=True, **kw) as acc:
        for i in range(n):
            acc.release(Laplace(0.1, sensitivity=1.0), float(i), dataset="adult" if i % 2 else "census",
                        analyst="alice" if i % 3 else "bob", label=f"q{i}")
    return url


def exported(tmp_path: Path, n: int = 6) -> tuple[Path, list[str]]:
    """``six_releases`` exported to JSONL: the file and its lines."""
    url = six_releases(tmp_path / "l.db", n)
    out = tmp_path / "l.jsonl"
    with open_ledger(url) as ledger:
        export_jsonl(ledger, out)
    return out, out.read_text().splitlines()


def png_size(path: Path) -> tuple[int, int, int]:
    """(width, height, size in bytes) of a PNG file, checking its signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height, len(data)
