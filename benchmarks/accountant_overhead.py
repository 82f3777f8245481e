"""Accountant overhead (issue 2): releases per second after k earlier releases.

Measures ``Accountant.release(Laplace(epsilon=1e-9), 1.0)`` after k = 10^3, 10^4, 10^5 earlier
releases on the same dataset, for

* the in-memory ledger (``ledger=None``),
* the SQLite ledger (``ledger="sqlite:///<tmpdir>/b.db"``) with the library's default, durable
  settings (WAL, ``synchronous=FULL``: SQLite syncs each commit itself, one
  ``BEGIN IMMEDIATE`` transaction per release),

next to diffprivlib's ``BudgetAccountant.spend`` at the same k (it rescans every earlier spend on
each call, so its cost grows linearly in k).

How the history is built (so that the whole run stays within a few minutes):

* in-memory: an accountant per k, given k untimed releases through the public API.
* SQLite: a ledger file per k, given k releases through the public API (the same
  ``Accountant.release`` call, the same records and hash chain) by an accountant whose connection
  has ``PRAGMA synchronous=OFF``, so that the untimed history
  does not wait for 10^5 fsyncs. A
  *new* ``Accountant`` is then opened on the file with the library defaults (which shows that it
  resumes without rescanning, and is checked to run WAL with synchronous=FULL), the filling one
  is closed (after, so that the WAL file is kept at its steady size rather than deleted and grown
  again, which makes the first few hundred commits of a freshly opened ledger slower), the file is
  fsynced, and only the new accountant is timed.
* diffprivlib: its public API can only pre-load spends through
  ``BudgetAccountant(spent_budget=...)``, which calls ``spend`` once per entry (O(k^2) in total).
  The k earlier spends are therefore put straight into its private spend list
  (``_BudgetAccountant__spent_budget``), which is exactly the state k successful ``spend`` calls
  leave behind. Each k is then timed for a bounded number of ``spend`` calls (at most
  ``--dpl-max`` calls or about ``--dpl-seconds`` seconds, at least 3 calls) and the rate is
  n / time; k grows by those few calls only. diffprivlib is given a finite ceiling (epsilon=1,
  delta=0), like dpbudget: with its default infinite ceiling ``check`` returns before looking at
  the history, i.e. it enforces nothing; that case is shown as a separate row.

Every timed window is split into ``--rounds`` chunks, timed in interleaved rounds (one chunk of
every row and k, then the next round), so that load from other processes on a shared machine hits
every k alike; a history that has grown more than 10 % beyond its k is rebuilt from scratch before
its next chunk. The table shows the median chunk (the printed details show min-max). CPU-bound rows
are timed by this thread's CPU time, SQLite rows by the wall clock (the printout has both). Noise is
drawn from the default source (the OS CSPRNG).

Usage::

    pip install -e ".[bench]"
    python benchmarks/accountant_overhead.py            # print the table
    python benchmarks/accountant_overhead.py --write    # ... and put it in benchmarks/README.md
    python benchmarks/accountant_overhead.py --profile  # also cProfile the in-memory release path
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import importlib.metadata
import importlib.util
import io
import os
import platform
import pstats
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from dpbudget.accountant import Accountant, Budget  # noqa: E402
from dpbudget.accountant.ledger import SqliteLedger  # noqa: E402
from dpbudget.mechanisms import Laplace  # noqa: E402
from dpbudget.policies.stored import POLICY_KEY  # noqa: E402

README = Path(__file__).resolve().parent / "README.md"
HEADING = "## Accountant overhead (issue 2)"
README_INTRO = """# Benchmarks

Scripts that measure dpbudget's performance (they are benchmarks, not tests: nothing here runs in
the test suite). Each script prints a markdown table; run it with `--write` to replace its own
section of this file.

```sh
pip install -e ".[bench]"
python benchmarks/<script>.py            # e.g. python benchmarks/accountant_overhead.py
```
"""

EPSILON = 1e-9  # tiny, so that 10^5 releases stay far inside the limit
LIMIT = Budget(1.0)  # a finite limit, so that the gate's check really runs
VALUE = 1.0
TARGET_MEMORY = 50_000
TARGET_SQLITE = 3_000


@dataclass
class Row:
    name: str
    rates: dict[int, float] = field(default_factory=dict)  # k -> median releases/s
    spreads: dict[int, tuple[float, float]] = field(default_factory=dict)  # k -> (min, max)
    counts: dict[int, int] = field(default_factory=dict)  # k -> calls timed
    wall: dict[int, float] = field(default_factory=dict)  # k -> median wall-clock calls/s
    cpu: dict[int, float] = field(default_factory=dict)  # k -> median CPU-time calls/s
    clock: str = "wall"  # which of the two the table shows ("wall" or "cpu")
    target: float | None = None
    note: str = ""


# -- timing helpers --------------------------------------------------------------------------

Chunks = tuple[list[float], list[float]]  # (wall-clock rates, CPU-time rates), calls/s


def _timed(step: Callable[[], Any], n: int) -> tuple[float, float]:
    """Rates of ``n`` calls of ``step``, by the wall clock and by this thread's CPU time (which
    leaves out time spent waiting for a core on a shared machine)."""
    clock, cpu_clock = time.perf_counter, time.thread_time
    t0, c0 = clock(), cpu_clock()
    for _ in range(n):
        step()
    c1, t1 = cpu_clock(), clock()
    return n / (t1 - t0), n / max(c1 - c0, 1e-9)


def _record(row: Row, k: int, chunks: Chunks, calls: int) -> None:
    wall, cpu = chunks
    row.wall[k], row.cpu[k] = statistics.median(wall), statistics.median(cpu)
    rates = cpu if row.clock == "cpu" else wall
    row.rates[k] = statistics.median(rates)
    row.spreads[k] = (min(rates), max(rates))
    row.counts[k] = calls
    lo, hi = row.spreads[k]
    print(f"  {row.name:<54} k={k:>7,}: {row.rates[k]:>10,.0f}/s {row.clock:<4} "
          f"({1e6 / row.rates[k]:7.1f} us; chunks {lo:,.0f}-{hi:,.0f}/s; "
          f"median wall {row.wall[k]:,.0f}/s, cpu {row.cpu[k]:,.0f}/s; {calls:,} calls)",
          flush=True)


def _fill(acc: Accountant, mechanism: Laplace, n: int) -> None:
    release = acc.release
    for _ in range(n):
        release(mechanism, VALUE)


class _Subject:
    """Something timed at one k: ``build()`` gives it exactly k earlier releases, ``step()`` is one
    timed call, ``count`` is how many releases its history holds now."""

    def __init__(self, row: Row, k: int) -> None:
        self.row, self.k, self.count = row, k, -1
        self.builds = 0

    grows = True  # False: timing does not depend on history; built once
    def build(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def check(self) -> None:
        """Assert the history holds ``count`` releases."""

    def close(self) -> None:
        pass


def _round_robin(subjects: list[_Subject], rounds: int, per_chunk: int,
                 slack: float = 0.1, warmup: int = 20) -> None:
    """Time ``rounds`` chunks of ``per_chunk`` calls for every subject, interleaved (round 1 of
    every subject, then round 2, ...), so that a burst of load from other processes hits every k
    alike. A subject is rebuilt from scratch (then warmed up by ``warmup`` untimed calls) whenever
    its history has grown more than ``slack`` beyond its k, so every chunk starts after between k
    and (1 + slack)·k earlier releases."""
    timings: dict[int, Chunks] = {id(s): ([], []) for s in subjects}
    for _ in range(rounds):
        for s in subjects:
            if s.count < 0 or (s.grows and s.count > s.k * (1 + slack)):
                s.close()
                s.build()
                s.builds += 1
                s.count = s.k
                for _ in range(warmup):  # a new connection's first commits are not typical
                    s.step()
                s.count += warmup
            wall, cpu = _timed(s.step, per_chunk)
            s.count += per_chunk
            timings[id(s)][0].append(wall)
            timings[id(s)][1].append(cpu)
    for s in subjects:
        s.check()
        s.close()
        _record(s.row, s.k, timings[id(s)], rounds * per_chunk)


def _check_history(acc: Accountant, expected: int) -> None:
    # A durable ledger's first record states its policy (not a release).
    seq = acc.ledger.head()[0] - (acc.ledger.account(POLICY_KEY) is not None)
    spent = acc.spent().epsilon
    if seq != expected or not abs(spent - expected * EPSILON) <= 1e-6 * expected * EPSILON:
        raise SystemExit(f"unexpected ledger state: seq={seq}, spent ε={spent!r}, "
                         f"expected {expected} releases")


# -- dpbudget ----------------------------------------------------------------------------------

class _Memory(_Subject):
    def __init__(self, row: Row, k: int, fresh_mechanism: bool) -> None:
        super().__init__(row, k)
        self.mechanism = Laplace(epsilon=EPSILON, sensitivity=1.0)
        self.fresh_mechanism = fresh_mechanism
        self.acc: Accountant | None = None

    def build(self) -> None:
        self.acc = Accountant(LIMIT, ledger=None)
        _fill(self.acc, self.mechanism, self.k)
        release, mechanism = self.acc.release, self.mechanism
        if self.fresh_mechanism:
            def step() -> None:
                release(Laplace(epsilon=EPSILON, sensitivity=1.0), VALUE)
        else:
            def step() -> None:
                release(mechanism, VALUE)
        self.step = step  # type: ignore[method-assign]

    def check(self) -> None:
        assert self.acc is not None
        _check_history(self.acc, self.count)

    def close(self) -> None:
        if self.acc is not None:
            self.acc.close()
            self.acc = None


def bench_memory(ks: list[int], window: int, rounds: int) -> list[Row]:
    plain = Row("dpbudget, in-memory (`ledger=None`)", target=TARGET_MEMORY, clock="cpu")
    fresh = Row("dpbudget, in-memory, new `Laplace` per call", clock="cpu")
    subjects: list[_Subject] = [_Memory(plain, k, False) for k in ks]
    subjects += [_Memory(fresh, k, True) for k in ks]
    _round_robin(subjects, rounds, max(1, window // rounds))
    return [plain, fresh]


class _Sqlite(_Subject):
    """A ledger file of its own per k. History: the same ``release`` call through an accountant
    whose connection skips fsync (untimed); then a new ``Accountant`` with the library's defaults
    resumes the file and is timed."""

    def __init__(self, row: Row, k: int, directory: Path) -> None:
        super().__init__(row, k)
        self.path = directory / f"b{k}.db"
        self.mechanism = Laplace(epsilon=EPSILON, sensitivity=1.0)
        self.acc: Accountant | None = None
        self.resume_ms: list[float] = []
        self.fast_fill = True

    def build(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        ledger = SqliteLedger(self.path)
        conn = getattr(ledger, "_conn", None)
        if isinstance(conn, sqlite3.Connection):
            conn.execute("PRAGMA synchronous=OFF")  # (the untimed history is fsynced once below)
        else:
            self.fast_fill = False
        filler = Accountant(LIMIT, ledger=ledger)
        _fill(filler, self.mechanism, self.k)
        t0 = time.perf_counter()
        self.acc = Accountant(LIMIT, ledger=f"sqlite:///{self.path}")
        self.acc.remaining()
        self.resume_ms.append((time.perf_counter() - t0) * 1e3)
        # Closed after the new accountant has opened the file, so that closing the last
        # connection does not delete the WAL: the timed releases then reuse a WAL file of steady
        # size, as a long-running process does, instead of growing a new one.
        filler.close()
        # Put the unsynced history on disk now (untimed): otherwise the first timed fsyncs would
        # also flush it.
        for suffix in ("", "-wal"):
            if Path(f"{self.path}{suffix}").exists():
                fd = os.open(f"{self.path}{suffix}", os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        pragmas = _sqlite_pragmas(self.acc)
        if pragmas is not None and (pragmas[0].lower() != "wal" or pragmas[1] != 2):
            raise SystemExit(f"the SQLite ledger is not durable by default: journal_mode="
                             f"{pragmas[0]}, synchronous={pragmas[1]} (expected wal, 2 = "
                             "FULL: each commit synced)")
        release, mechanism = self.acc.release, self.mechanism

        def step() -> None:
            release(mechanism, VALUE)
        self.step = step  # type: ignore[method-assign]

    def check(self) -> None:
        assert self.acc is not None
        _check_history(self.acc, self.count)

    def close(self) -> None:
        if self.acc is not None:
            self.acc.close()
            self.acc = None


class _SqliteFloor(_Subject):
    """SQLite alone: ``BEGIN IMMEDIATE``; one INSERT of a record of the ledger's size; ``COMMIT``;
    WAL + ``synchronous=FULL``, in the same directory: what one durable transaction costs on this
    disk with no dpbudget code around it, the ceiling for any durable per-release ledger. Timed
    right after the dpbudget chunk of the same k, so that both see the same load."""

    conn: sqlite3.Connection | None = None
    grows = False

    def __init__(self, row: Row, k: int, directory: Path) -> None:
        super().__init__(row, k)
        self.path = directory / f"floor{k}.db"
        self.seq = 0
        self.record = "x" * 520

    def build(self) -> None:
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS entries "
                          "(seq INTEGER PRIMARY KEY, hash TEXT NOT NULL, record TEXT NOT NULL)")
        self.seq = self.conn.execute("SELECT coalesce(max(seq), 0) FROM entries").fetchone()[0]

    def step(self) -> None:
        assert self.conn is not None
        self.seq += 1
        execute = self.conn.execute
        execute("BEGIN IMMEDIATE")
        execute("INSERT INTO entries VALUES (?, ?, ?)", (self.seq, "0" * 64, self.record))
        execute("COMMIT")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _sqlite_pragmas(acc: Accountant) -> tuple[str, int] | None:
    conn = getattr(acc.ledger, "_conn", None)
    if not isinstance(conn, sqlite3.Connection):
        return None
    return (conn.execute("PRAGMA journal_mode").fetchone()[0],
            conn.execute("PRAGMA synchronous").fetchone()[0])


def bench_sqlite(ks: list[int], window: int, rounds: int, directory: Path) -> list[Row]:
    row = Row("dpbudget, SQLite, durable (WAL, synced before each draw)", target=TARGET_SQLITE)
    floor_row = Row("SQLite alone: 1 INSERT per durable transaction (floor)")
    ledgers = [_Sqlite(row, k, directory) for k in ks]
    subjects: list[_Subject] = []
    for s in ledgers:
        subjects += [s, _SqliteFloor(floor_row, s.k, directory)]
    _round_robin(subjects, rounds, max(1, window // rounds))
    row.note = ("opening the ledger again (new `Accountant` + first `remaining()`): "
                + ", ".join(f"{statistics.median(s.resume_ms):.1f} ms at k={_k(s.k)}"
                            for s in ledgers))
    if not all(s.fast_fill for s in ledgers):
        row.note += "; history written durably (no private connection to speed it up)"
    floor_row.note = ("no dpbudget code: `BEGIN IMMEDIATE`, one INSERT of a 520-character "
                      "record, `COMMIT`, WAL + `synchronous=FULL`, same directory, timed right "
                      "after each dpbudget chunk: the most any durable ledger that commits once "
                      "per release can do on this disk")
    return [row, floor_row]


# -- diffprivlib ----------------------------------------------------------------------------------

def import_diffprivlib() -> tuple[Any, str | None, str]:
    """``(BudgetAccountant class or None, version, note)``."""
    try:
        from diffprivlib.accountant import BudgetAccountant
    except ImportError as exc:
        if importlib.util.find_spec("diffprivlib") is None:
            return None, None, "not installed"
        # `import diffprivlib` imports all its models, which break on some scikit-learn versions
        # (diffprivlib 0.6.6 with scikit-learn >= 1.8). The accountant needs none of them: import
        # diffprivlib.accountant on its own, under a bare parent package.
        for name in [n for n in sys.modules if n == "diffprivlib" or n.startswith("diffprivlib.")]:
            del sys.modules[name]
        spec = importlib.util.find_spec("diffprivlib")
        parent = types.ModuleType("diffprivlib")
        parent.__path__ = list(spec.submodule_search_locations or [])
        sys.modules["diffprivlib"] = parent
        try:
            BudgetAccountant = importlib.import_module("diffprivlib.accountant").BudgetAccountant
        except ImportError as exc2:
            return None, _version("diffprivlib"), f"not importable ({exc2})"
        return (BudgetAccountant, _version("diffprivlib"),
                f"`import diffprivlib` fails here ({exc}); `diffprivlib.accountant` was imported "
                f"on its own")
    return BudgetAccountant, _version("diffprivlib"), ""


def bench_diffprivlib(cls: Any, ks: list[int], seconds: float, max_calls: int, *,
                      ceiling: bool) -> Row:
    name = ("diffprivlib `BudgetAccountant.spend` (ε ceiling 1)" if ceiling else
            "diffprivlib `spend`, no ceiling (checks nothing)")
    row = Row(name, clock="cpu")
    for k in ks:
        acc = cls(epsilon=1.0, delta=0.0) if ceiling else cls()
        spends = getattr(acc, "_BudgetAccountant__spent_budget", None)
        if not isinstance(spends, list):
            row.note = "could not pre-populate its spend list (private attribute not found)"
            print(f"  {name}: {row.note}")
            return row
        spends.extend((EPSILON, 0.0) for _ in range(k))
        spend = acc.spend
        clock, cpu_clock = time.perf_counter, time.thread_time
        rates: list[float] = []
        n, batch = 0, 1
        start, cpu_start = clock(), cpu_clock()
        while n < max_calls and (n < 3 or clock() - start < seconds):
            b = min(batch, max_calls - n)
            c0 = cpu_clock()
            for _ in range(b):
                spend(EPSILON, 0.0)
            rates.append(b / max(cpu_clock() - c0, 1e-9))
            n += b
            batch = min(2 * batch, 256)
        cpu_elapsed, elapsed = cpu_clock() - cpu_start, clock() - start
        if len(acc) != k + n:
            raise SystemExit(f"diffprivlib holds {len(acc)} spends, expected {k + n}")
        # The rate over the whole bounded run of n calls; the spread is over its batches.
        row.rates[k] = row.cpu[k] = n / max(cpu_elapsed, 1e-9)
        row.wall[k] = n / elapsed
        row.spreads[k] = (min(rates), max(rates))
        row.counts[k] = n
        print(f"  {name:<54} k={k:>7,}: {row.rates[k]:>10,.1f}/s cpu  "
              f"({1e6 / row.rates[k]:10.1f} us/spend; wall {row.wall[k]:,.1f}/s; {n:,} calls "
              f"in {elapsed:.2f} s)", flush=True)
    if ceiling:
        row.note = (f"k earlier spends put into its spend list directly; at most "
                    f"{max_calls:,} calls or about {seconds:g} s timed per k (" + ", ".join(
                        f"{row.counts[k]:,} at k={_k(k)}" for k in ks) + ")")
    return row


# -- profile --------------------------------------------------------------------------------------

def profile_memory(k: int, n: int, top: int) -> str:
    mechanism = Laplace(epsilon=EPSILON, sensitivity=1.0)
    acc = Accountant(LIMIT, ledger=None)
    _fill(acc, mechanism, k)
    profiler = cProfile.Profile()
    profiler.enable()
    _fill(acc, mechanism, n)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# -- reporting -------------------------------------------------------------------------------------

def _k(k: int) -> str:
    exp = len(str(k)) - 1
    return f"10^{exp}" if k == 10 ** exp else f"{k:,}"


def _rate(rate: float | None) -> str:
    if rate is None:
        return "–"
    if rate >= 100:
        return f"{rate:,.0f}/s"
    return f"{rate:,.1f}/s"


def _us(rate: float) -> str:
    us = 1e6 / rate
    return f"{us:,.0f} µs" if us >= 100 else f"{us:.1f} µs"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_facts() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for dist in ("dpbudget", "numpy", "scipy", "pydantic", "diffprivlib", "scikit-learn"):
        v = _checkout_version() if dist == "dpbudget" else _version(dist)
        versions.append(f"{dist} {v or 'not installed'}")
    return (f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}; "
            + ", ".join(versions))


def _checkout_version() -> str:
    """The version in pyproject.toml, and the git commit when run from a checkout."""
    version = "?"
    try:
        m = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
        version = m.group(1) if m else version
        if (ROOT / ".git").exists():
            git = ["git", "-C", str(ROOT)]
            commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, timeout=5).stdout.strip()
            dirty = subprocess.run([*git, "status", "--porcelain", "--", "accountant",
                                    "mechanisms", "policies"], capture_output=True, text=True,
                                   timeout=5).stdout.strip()
            if commit:
                version += f" (checkout {commit}{' + uncommitted changes' if dirty else ''})"
    except (OSError, subprocess.SubprocessError):
        pass
    return version


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def table(rows: list[Row], ks: list[int], skipped: list[tuple[str, str]],
          args: argparse.Namespace, facts: str, total_s: float, load: tuple[float, float]) -> str:
    lo, hi = ks[0], ks[-1]
    head = ["", "clock", *[f"k = {_k(k)}" for k in ks],
            f"time per release, k = {_k(lo)} → {_k(hi)}", "target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1))
             + "|"]
    for row in rows:
        cells = [row.name, "CPU" if row.clock == "cpu" else "wall",
                 *[_rate(row.rates.get(k)) for k in ks]]
        if lo in row.rates and hi in row.rates:
            ratio = row.rates[lo] / row.rates[hi]
            cells.append(f"{_us(row.rates[lo])} → {_us(row.rates[hi])} (×{ratio:.2f})")
        else:
            cells.append("–")
        if row.target is None:
            cells.append("")
        else:
            worst = min(row.rates.values()) if row.rates else 0.0
            cells.append(f"≥ {row.target:,.0f}/s: {'met' if worst >= row.target else 'missed'}")
        lines.append("| " + " | ".join(cells) + " |")
    for name, why in skipped:
        lines.append("| " + " | ".join([name, "", *[why] * len(ks), "–", ""]) + " |")
    caption = (f"Releases per second after k earlier releases on one dataset "
               f"(`Laplace(epsilon=1e-9, sensitivity=1.0)` on a scalar, limit `Budget(1.0)`, noise from the OS "
               f"CSPRNG). Each dpbudget cell is the median chunk of interleaved rounds (every "
               f"row and k in turn): {args.rounds} chunks of "
               f"{args.memory_window // args.rounds:,} in-memory releases, "
               f"{args.sqlite_rounds} chunks of {args.sqlite_window // args.sqlite_rounds:,} "
               f"SQLite releases, each chunk starting after k to 1.1·k earlier releases. "
               f"*CPU*: calls per second of this thread's CPU time (user + system), which "
               f"leaves out the time spent waiting for a core while other processes run (they "
               f"can still slow it through shared caches and hyperthreads); used for the "
               f"CPU-bound rows. *wall*: calls per second of elapsed time, used for SQLite, whose "
               f"cost is mostly waiting for fsync. Run at "
               f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC on {facts}; "
               f"it took {total_s:.0f} s; "
               f"1-minute load average {load[0]:.2f} at the start, {load[1]:.2f} at the end.")
    notes = []
    for r in rows:
        extra = []
        if r.clock == "cpu" and r.wall:
            extra.append("by the wall clock " + ", ".join(
                f"{_rate(r.wall[k])} at k={_k(k)}" for k in ks if k in r.wall))
        elif r.clock == "wall" and r.cpu:
            extra.append("fastest chunk " + ", ".join(
                f"{_rate(r.spreads[k][1])} at k={_k(k)}" for k in ks if k in r.spreads))
            extra.append("CPU time per release " + ", ".join(
                f"{_us(r.cpu[k])} at k={_k(k)}" for k in ks if k in r.cpu))
        if r.note:
            extra.append(r.note)
        if extra:
            notes.append(f"{r.name}: " + "; ".join(extra) + ".")
    out = [caption, "", *lines]
    if notes:
        out += ["", *[f"- {n}" for n in notes]]
    return "\n".join(out) + "\n"


def write_readme(section_body: str) -> None:
    section = f"{HEADING}\n\n{section_body}" + _how_to_read()
    text = README.read_text() if README.exists() else README_INTRO
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == HEADING), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    README.write_text(new)
    print(f"wrote {README}")


def _how_to_read() -> str:
    return """
How it is measured (`benchmarks/accountant_overhead.py`; `--profile` adds a cProfile of the
in-memory path, `--write` rewrites this section):

- The history is built through the public API: the same `Accountant.release` call, the same
  records and hash chain. For SQLite it is written by an accountant whose connection runs
  `synchronous=OFF` (untimed, then fsynced); the timed releases go through a *new* `Accountant`
  opened on that file with the library defaults (checked: WAL and `synchronous=FULL`, each commit synced), so every timed
  release waits for its own fsync, and opening the ledger again shows that it resumes without a
  rescan. The filling accountant is closed only after that, so the WAL file keeps its steady size
  (a ledger opened by a lone process starts a new WAL, and its first few hundred commits, which
  grow that file, ran about 30 % slower here).
- Rows and k's are timed in interleaved rounds, so that load from other processes on a shared
  machine hits every k alike. CPU-bound rows are timed by the thread's CPU time; SQLite rows by
  the wall clock, next to a bare-SQLite row (one durable INSERT per transaction, no dpbudget code)
  that shows what the disk allows at that moment.
- diffprivlib: the k earlier spends are put into its spend list directly (its public API adds them
  one `spend` at a time, O(k²) in total), then a bounded number of `spend` calls is timed at each
  k. It is given a finite ceiling like dpbudget: without one, `check` returns at once and nothing
  is enforced (the last row). diffprivlib 0.6.6 cannot be imported with scikit-learn >= 1.8
  (`import diffprivlib` imports its models); the script then imports `diffprivlib.accountant` on
  its own, or install `scikit-learn<1.8` beside it.
"""


# -- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ks", default="1000,10000,100000",
                   help="comma-separated numbers of earlier releases (default: %(default)s)")
    p.add_argument("--memory-window", type=int, default=20_000,
                   help="timed in-memory releases per k (default: %(default)s)")
    p.add_argument("--sqlite-window", type=int, default=2_000,
                   help="timed durable SQLite releases per k (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=10,
                   help="interleaved rounds for the in-memory rows: each timed window is split "
                        "into this many chunks; the table shows the median (default: %(default)s)")
    p.add_argument("--sqlite-rounds", type=int, default=40,
                   help="interleaved rounds for the SQLite rows (default: %(default)s)")
    p.add_argument("--dpl-seconds", type=float, default=3.0,
                   help="seconds of diffprivlib spends per k (default: %(default)s)")
    p.add_argument("--dpl-max", type=int, default=2_000,
                   help="most diffprivlib spends per k (default: %(default)s)")
    p.add_argument("--profile", action="store_true",
                   help="also cProfile 20,000 in-memory releases after 10^4 and print the top")
    p.add_argument("--write", action="store_true",
                   help=f"replace the '{HEADING}' section of {README.name}")
    args = p.parse_args(argv)
    ks = sorted(int(k) for k in args.ks.split(","))

    started = time.perf_counter()
    load_start = _load()
    facts = machine_facts()
    print(f"machine: {facts}\n", flush=True)
    rows: list[Row] = []
    skipped: list[tuple[str, str]] = []

    print("dpbudget, in-memory", flush=True)
    rows.extend(bench_memory(ks, args.memory_window, args.rounds))

    print("dpbudget, SQLite (durable)", flush=True)
    with tempfile.TemporaryDirectory(prefix="dpbudget-bench-") as tmp:
        rows.extend(bench_sqlite(ks, args.sqlite_window, args.sqlite_rounds, Path(tmp)))

    print("diffprivlib", flush=True)
    cls, version, note = import_diffprivlib()
    if cls is None:
        print(f"  diffprivlib: {note}")
        skipped.append(("diffprivlib `BudgetAccountant.spend`", note))
    else:
        if note:
            print(f"  note: {note}")
        row = bench_diffprivlib(cls, ks, args.dpl_seconds, args.dpl_max, ceiling=True)
        if note:
            row.note = f"{row.note}; {note}" if row.note else note
        rows.append(row)
        rows.append(bench_diffprivlib(cls, ks, min(args.dpl_seconds, 0.5), args.dpl_max,
                                      ceiling=False))

    total = time.perf_counter() - started
    body = table(rows, ks, skipped, args, facts, total, (load_start, _load()))
    print("\n" + body)
    if args.profile:
        print(profile_memory(10_000, 20_000, 25))
    if args.write:
        write_readme(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
