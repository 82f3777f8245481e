"""The table queries on Dask (dpbudget.accountant.tables.dask), on the synchronous scheduler.

The attacks: a unit whose rows lie in several partitions is bounded once per partition and
moves an aggregate by more than its sensitivity (brute force, every unit removed; negative
controls: no shuffle, and the row-level Δ = 1); keys tied to the sorted order change the
bounding's law (a unit with rows A, A, B kept 2 keeps {A, A} w.p. 1/3; negative control: keys
drawn in order); a retried task, seeing its partition in another order, keys it differently
(negative control: no sort); a source evaluated twice (read once into Parquet); a job failing
after the debit releases something or spends twice; the post-debit seed in a record, a log
line, an error or a graph key. And the five queries answer as on pandas where no bound
truncates.

Skipped when dask is absent locally; under CI (``CI=true``, where the test extra installs
``dask[dataframe]``) a missing dask fails instead.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import dpbudget as dp
from dpbudget.accountant.ledger import SqliteLedger
from dpbudget.accountant.tables import bounding, frames, sensitivities as sens
from dpbudget.accountant.tables.builder import table
from dpbudget.accountant.tables.sensitivities import Contribution
from dpbudget.accountant.values.errors import InvalidDataError, InvalidDataTypeError
from dpbudget.examples.events import events_frame

from tests.tables._tables import PERSON, events_accountant, five_queries, small_table

if importlib.util.find_spec("dask") is None or importlib.util.find_spec("pyarrow") is None:
    if os.environ.get("CI"):
        pytest.fail("dask[dataframe] is missing under CI (the test extra installs it)")
    pytest.skip("dask is not installed (pip install 'dpbudget[dask]')", allow_module_level=True)

import dask  # noqa: E402
import dask.dataframe as dd  # noqa: E402

from dpbudget.accountant.tables import dask as on_dask  # noqa: E402

ALPHA = 1e-6
# dask's Parquet reader calls reset_index(inplace=True), deprecated in pandas 3.1: not ours.
pytestmark = [pytest.mark.filterwarnings("ignore:The inplace keyword in DataFrame.reset_index")]


@pytest.fixture(autouse=True)
def synchronous() -> Any:
    with dask.config.set(scheduler="sync"):
        yield


_acc, _five = events_accountant, five_queries


def _run(frame: pd.DataFrame, seed: int, columns: list[str], folder: Path) -> Any:
    """``collected``'s ``run`` on ``frame`` as Dask (its columns ``inner``), keyed from ``seed``;
    and the inner names."""
    opened = on_dask.Frame(dd.from_pandas(frame, npartitions=4, sort=False))
    n = frames.inner(columns)
    rows = opened.read(columns, str(folder / str(len(list(folder.iterdir())))))
    return on_dask.collected(rows, np.random.default_rng(seed), "dask", columns, n["unit"]), n


def test_the_five_queries_answer_the_same_on_pandas_and_dask() -> None:
    """No bound truncates (at most 40 rows per person, bound 40): the same true values, the
    same post-debit draws, identical answers, the mean's to rounding (sums add in another
    order)."""
    pdf = events_frame(persons=400, seed=3)
    assert pdf.groupby(PERSON).size().max() <= 40
    local, spread = _five(pdf, 40), _five(dd.from_pandas(pdf, npartitions=4), 40)
    for q in ("Q1", "Q3", "Q4", "Q5"):
        assert local[q] == spread[q], q
    assert local["Q5"]  # (selection released keys: not an empty answer on both)
    assert local["Q2"].keys() == spread["Q2"].keys()
    for key, parts in local["Q2"].items():
        assert spread["Q2"][key] == pytest.approx(parts, rel=1e-9)


def test_a_dask_frame_is_opened_with_its_schema_and_its_copy_removed(tmp_path: Path,
                                                                     monkeypatch: Any) -> None:
    """The copy lives in a folder of the query's own, gone once the query ends, released or
    refused (nothing debited)."""
    import narwhals as nw
    opened = on_dask.opened(dd.from_pandas(small_table(0), npartitions=2))
    assert opened is not None and opened.kind == "dask"
    assert on_dask.opened(small_table(0)) is None  # (pandas: ``frames.open_frame``'s)
    assert opened.schema == {"unit": nw.Int64(), "group": nw.String(), "x": nw.Float64()}
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    acc = _acc(eps=1.0)
    t = table(acc, dd.from_pandas(small_table(0).rename(columns={"unit": PERSON}),
                                  npartitions=2), dataset="events")
    t.count(epsilon=1.0, max_rows_per_unit=3).release()
    with pytest.raises(dp.BudgetExceededError):
        t.count(epsilon=1.0, max_rows_per_unit=3).release()
    assert acc.spent("events").epsilon == pytest.approx(1.0)
    assert list(tmp_path.iterdir()) == []


def _kept_sums(frame: pd.DataFrame, seed: int, c: Contribution, folder: Path) -> np.ndarray:
    run, n = _run(frame, seed, ["unit", "x"], folder)
    found = run(bounding.unit_groups, n["unit"], [], c, n["x"], -100.0, 100.0)
    return np.asarray(found[bounding.SUM], dtype=np.float64)


class _InOrder:
    """The broken keys: uniforms drawn in increasing order, so the first rows of the sorted
    partition always get the smallest keys."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def random(self, n: int) -> np.ndarray:
        return np.sort(self.rng.random(n))


@pytest.mark.statistical
def test_a_unit_with_rows_a_a_b_keeps_a_a_a_third_of_the_time(tmp_path: Path,
                                                               monkeypatch: Any) -> None:
    """600 units of rows A, A, B (x = 1, 1, 5), two rows kept: {A, A} (sum 2) with probability
    1/3, as with iid keys; a binomial test at α = 1e-6, fixed seed. Negative control: keys
    drawn in increasing order along the sorted partition keep {A, A} always, and the test
    rejects it."""
    units = 600
    pdf = pd.DataFrame({"unit": np.repeat(np.arange(units), 3),
                        "x": np.tile([1.0, 1.0, 5.0], units)})
    c = Contribution(groups=2, per_group=2, total=2, by_group=False)
    sums = _kept_sums(pdf, 1, c, tmp_path)
    assert len(sums) == units and set(sums) <= {2.0, 6.0}
    assert stats.binomtest(int((sums == 2.0).sum()), units, 1 / 3).pvalue > ALPHA
    real = frames.keyed
    monkeypatch.setattr(frames, "keyed", lambda rows, rng, kind: real(rows, _InOrder(rng), kind))
    broken = _kept_sums(pdf, 1, c, tmp_path)
    assert stats.binomtest(int((broken == 2.0).sum()), units, 1 / 3).pvalue < ALPHA


def _spread(units: int = 6) -> pd.DataFrame:
    """Units of 2 to 9 rows in groups a, b, c, one value each (so every aggregate below is the
    same for every key draw), rows interleaved: each unit's rows lie in several of the 4 input
    partitions."""
    rng = np.random.default_rng(7)
    sizes = rng.integers(2, 10, units)
    unit = np.concatenate([np.arange(units)[sizes > i] for i in range(sizes.max())])
    return pd.DataFrame({"unit": unit, "group": np.asarray(list("abc"))[rng.integers(0, 3, len(unit))],
                         "x": np.asarray(rng.uniform(-5, 15, units).round(2))[unit]})


def _worst(frame: pd.DataFrame, folder: Path) -> dict[str, float]:
    """Over every unit removed, the L1 change of each aggregate vector: ROWS, UNITS, SUM over
    the whole table at C = 3 rows per unit, and ROWS per group at L0 = 3 groups (all a unit
    has), L∞ = 2."""
    c = Contribution(groups=3, per_group=3, total=3, by_group=False)
    g = Contribution(groups=3, per_group=2, total=6, by_group=True)

    def aggregates(table_: pd.DataFrame) -> dict[str, np.ndarray]:
        run, n = _run(table_, 0, ["unit", "group", "x"], folder)
        whole = run(bounding.per_group, n["unit"], [], c, n["x"], 0.0, 10.0)
        grouped = run(bounding.per_group, n["unit"], [n["group"]], g)
        at = {k: i for i, k in enumerate(grouped[n["group"]].tolist())}
        rows = np.array([float(grouped[bounding.ROWS][at[k]]) if k in at else 0.0 for k in "abc"])
        return {"rows": np.asarray(whole[bounding.ROWS], dtype=float),
                "units": np.asarray(whole[bounding.UNITS], dtype=float),
                "sum": np.asarray(whole[bounding.SUM], dtype=float), "grouped": rows}

    full = aggregates(frame)
    worst = dict.fromkeys(full, 0.0)
    for unit in frame["unit"].unique():
        less = aggregates(frame[frame["unit"] != unit])
        for name in worst:
            worst[name] = max(worst[name], float(np.abs(full[name] - less[name]).sum()))
    return worst


def test_one_unit_spread_over_partitions_moves_each_aggregate_by_at_most_its_sensitivity(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Brute force: every unit removed moves each aggregate by at most its formula (C = 3 rows,
    1 unit, C·max|clamp| = 30; L0·L∞ = 6 grouped), though each unit's rows lie in several
    input partitions. Negative controls: the change exceeds 1 (a row-level Δ would not hold);
    without the shuffle a unit is bounded once per partition, and exceeds C."""
    frame = _spread()
    parts = dd.from_pandas(frame, npartitions=4, sort=False).to_delayed()
    assert max(sum(frame.loc[p.compute().index, "unit"].eq(0)) > 0 for p in parts[1:])
    c = Contribution(groups=3, per_group=3, total=3, by_group=False)
    worst = _worst(frame, tmp_path)
    assert worst["rows"] <= sens.count(c) and worst["units"] <= 1
    assert worst["sum"] <= sens.sum_of(c, sens.clamp(0.0, 10.0)) + 1e-9
    assert worst["grouped"] <= sens.count(Contribution(groups=3, per_group=2, total=6,
                                                       by_group=True))
    assert worst["rows"] > 1  # (a row-level Δ = 1 would not hold: the test can fail)
    monkeypatch.setattr(on_dask, "_by_unit", lambda native, unit: native)
    assert _worst(frame, tmp_path)["rows"] > sens.count(c)


def test_a_retried_task_sees_its_rows_in_the_same_order_and_keys_them_the_same() -> None:
    """One partition's partial aggregates, from its rows in another order (what a recomputed
    shuffle may hand a retried task), are the same; another partition index keys them
    otherwise. Negative control: without the sort, the permuted rows keep other rows."""
    import narwhals as nw
    rng = np.random.default_rng(3)
    part = pd.DataFrame({"u": np.repeat(np.arange(40), 5), "x": rng.uniform(0, 10, 200)})
    part = pd.concat([part, part.head(5)], ignore_index=True)  # (identical rows too)
    shuffled = part.sample(frac=1.0, random_state=1).reset_index(drop=True)
    c = Contribution(groups=2, per_group=2, total=2, by_group=False)
    step = on_dask.functools.partial(
        on_dask._partial, seed=on_dask._Seed(np.random.default_rng(9)),
        step=bounding.unit_groups, args=("u", [], c, "x", 0.0, 10.0), kwargs={})
    first = step(part, partition_info={"number": 2})
    assert first.equals(step(shuffled, partition_info={"number": 2}))
    assert not first.equals(step(part, partition_info={"number": 3}))

    def unsorted(rows: pd.DataFrame) -> pd.DataFrame:  # (the same, without the sort)
        keyed = frames.keyed(nw.from_native(rows, eager_only=True),
                             np.random.default_rng([*step.keywords["seed"].words, 2]), "pandas")
        out = bounding.unit_groups(keyed, "u", [], c, "x", 0.0, 10.0).collect().to_native()
        return out.sort_values("u", ignore_index=True)

    assert not unsorted(part).equals(unsorted(shuffled))


def test_a_source_that_changes_between_reads_is_read_once(tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    """A Dask frame over a Parquet file rewritten after the query's read (before the debit):
    the answer is the first version's. The copy, not the source, is what the bounding reads.
    Negative control: without the copy, the bounding reads the rewritten file."""
    source = tmp_path / "source.parquet"
    first = small_table(1, units=5).rename(columns={"unit": PERSON})
    first.to_parquet(source)
    t = table(_acc(rng=1), dd.read_parquet(source), dataset="events")
    query = t.count(epsilon=1.0, max_rows_per_unit=100)
    real = query._read

    def then_rewritten(state: dict[str, Any], scratch: str | None = None) -> list[Any]:
        mechanisms = real(state, scratch)
        pd.concat([first] * 50).to_parquet(source)  # (fifty times the rows)
        return mechanisms

    query._read = then_rewritten  # type: ignore[method-assign]
    answer = query.release()
    expected = table(_acc(rng=1), first, dataset="events").count(
        epsilon=1.0, max_rows_per_unit=100).release()
    assert answer == expected
    first.to_parquet(source)  # Negative control: without the copy, the rewrite is counted
    import narwhals as nw
    monkeypatch.setattr(on_dask, "copy", lambda native, folder: nw.from_native(native))
    query = table(_acc(rng=1), dd.read_parquet(source), dataset="events").count(
        epsilon=1.0, max_rows_per_unit=100)
    real = query._read
    query._read = then_rewritten  # type: ignore[method-assign]
    assert query.release() > answer + 100


def test_a_job_that_fails_after_the_debit_releases_nothing_once_and_hides_the_seed(
        monkeypatch: Any, caplog: Any, tmp_path: Path) -> None:
    """A task fails after the debit: nothing is released, the budget stays spent, one record;
    the post-debit seed is in no record, ledger byte, log line, error or graph key."""
    seeds: list[str] = []
    graphs: list[str] = []
    real, real_by_unit = on_dask._partial, on_dask._by_unit

    def failing(part: Any, *, seed: Any, partition_info: Any = None, **rest: Any) -> Any:
        seeds.append(" ".join(map(str, seed.words)))
        if partition_info is not None:
            raise RuntimeError("lost")
        return real(part, seed=seed, partition_info=partition_info, **rest)

    def by_unit(native: Any, unit: str) -> Any:
        out = real_by_unit(native, unit)
        graphs.append(repr(out.__dask_keys__()))
        return out

    monkeypatch.setattr(on_dask, "_partial", failing)
    monkeypatch.setattr(on_dask, "_by_unit", by_unit)
    ledger = SqliteLedger(tmp_path / "ledger.db")
    acc = dp.Accountant(limits={"t": dp.DatasetLimit(limit=dp.Budget(10.0),
                                                     privacy_unit="unit")}, ledger=ledger)
    before = len(list(ledger.entries()))
    t = table(acc, dd.from_pandas(small_table(3, units=4), npartitions=2), dataset="t")
    query = t.group_by("group", keys=["a", "b", "c"]).count(epsilon=1.0, max_rows_per_unit=3)
    with caplog.at_level(logging.DEBUG), pytest.raises(InvalidDataError) as raised:
        query.release()
    assert "the debit stands" in str(raised.value) + " ".join(raised.value.__notes__ or [])
    assert acc.spent("t").epsilon == pytest.approx(1.0)
    assert len(list(ledger.entries())) == before + 1
    seed = seeds[0]
    assert len(set(seeds)) == 1  # (one seed per query, every task)
    said = [str(raised.value), repr(raised.value), *(raised.value.__notes__ or []),
            caplog.text, repr(query), *graphs, *(e.text for e in ledger.entries())]
    assert not any(seed in s for s in said)
    assert seed.encode() not in (tmp_path / "ledger.db").read_bytes()
    assert "lost" not in str(raised.value)  # (the engine's message is withheld)
    assert repr(on_dask._Seed(np.random.default_rng(0))) == "<seed withheld>"


def test_a_null_unit_in_a_dask_frame_is_refused_before_the_debit() -> None:
    """The same checks as the other engines, on every row, before anything is spent."""
    pdf = small_table(2, units=4).rename(columns={"unit": PERSON})
    pdf[PERSON] = pdf[PERSON].astype("Int64")
    pdf.loc[3, PERSON] = None
    acc = _acc()
    t = table(acc, dd.from_pandas(pdf, npartitions=2), dataset="events")
    with pytest.raises(InvalidDataError, match="null"):
        t.count(epsilon=1.0, max_rows_per_unit=3).release()
    assert acc.spent("events").epsilon == 0.0


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                    reason="distributed is not installed")
def test_a_local_distributed_cluster_answers_as_the_synchronous_scheduler() -> None:
    """Two worker processes: the tasks get the seed as pickled data, the same answer."""
    from distributed import Client, LocalCluster, get_task_stream
    pdf = small_table(4, units=30, max_rows=8).rename(columns={"unit": PERSON})
    expected = table(_acc(), dd.from_pandas(pdf, npartitions=3), dataset="events").group_by(
        "group", keys=["a", "b", "c"]).sum("x", lower=0, upper=10, epsilon=1.0,
                                          max_rows_per_unit=3).release()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster):
        with dask.config.set(scheduler=None), get_task_stream() as stream:
            got = table(_acc(), dd.from_pandas(pdf, npartitions=3), dataset="events").group_by(
                "group", keys=["a", "b", "c"]).sum("x", lower=0, upper=10, epsilon=1.0,
                                                  max_rows_per_unit=3).release()
    assert got == pytest.approx(expected)
    assert any("_partial" in task["key"][0] for task in stream.data)  # (run on the workers)


def _object_ids() -> pd.DataFrame:
    """Person 7 as 7 and 7.0 (an object column), 4 rows; 40 others, one row each."""
    return pd.DataFrame({PERSON: pd.Series([7, 7.0, 7, 7.0, *range(100, 140)], dtype=object),
                         "v": 1.0})


def test_one_person_as_7_and_7_0_is_refused_before_the_debit(monkeypatch: Any) -> None:
    """Dask's convert-string made the object ids "7" and "7.0": two units, 4 rows kept under
    max_rows_per_unit=2 (bounded truth 42). Refused before the debit, nothing spent, built from
    pandas (renamed too) or from delayed pandas parts. Negative control: without the check, the
    count charges person 7 twice (44)."""
    def count(frame: Any, acc: Any) -> Any:
        return table(acc, frame, dataset="events").count(epsilon=1e6,
                                                         max_rows_per_unit=2).release()

    pdf = _object_ids()
    built = [dd.from_pandas(pdf, npartitions=3),
             dd.from_pandas(pdf.rename(columns={PERSON: "q"}), npartitions=3).rename(
                 columns={"q": PERSON}),
             dd.from_delayed([dask.delayed(pdf.copy)()], meta=pdf.head(0))]
    for frame in built:
        acc = _acc(eps=1e7)
        with pytest.raises(InvalidDataTypeError, match="convert-string") as raised:
            count(frame, acc)
        assert "7.0" not in str(raised.value)
        assert acc.spent("events").epsilon == 0.0
    clean = pdf.assign(**{PERSON: pdf[PERSON].astype("int64")})  # (one type: person 7, 2 rows)
    assert round(count(dd.from_pandas(clean, npartitions=3), _acc(eps=1e7))) == 42
    monkeypatch.setattr(on_dask, "_one_type", lambda native: None)
    assert round(count(dd.from_pandas(pdf, npartitions=3), _acc(eps=1e7))) == 44


def test_a_copy_the_client_reads_in_part_is_refused_before_the_debit(monkeypatch: Any) -> None:
    """A worker wrote its part where the client does not see it (a worker's own /tmp): the copy
    the client reads lacks a part; refused, nothing spent. Negative control: without the count,
    the query releases a count of the subset."""
    pdf = small_table(5, units=30, max_rows=3).rename(columns={"unit": PERSON})
    real = dd.DataFrame.to_parquet

    def on_a_worker(self: Any, path: str, **kwargs: Any) -> Any:
        out = real(self, path, **kwargs)
        os.remove(os.path.join(path, "part.1.parquet"))  # (on another machine)
        return out

    monkeypatch.setattr(dd.DataFrame, "to_parquet", on_a_worker)
    acc = _acc(eps=1e7)
    query = table(acc, dd.from_pandas(pdf, npartitions=3), dataset="events").count(
        epsilon=1e6, max_rows_per_unit=100)
    with pytest.raises(dp.InvalidArgumentError, match="scratch"):
        query.release()
    assert acc.spent("events").epsilon == 0.0
    monkeypatch.setattr(on_dask, "_complete", lambda path, parts: None)
    assert round(query.release()) < len(pdf)


def test_without_narwhals_dask_support_a_dask_frame_is_a_typed_refusal(monkeypatch: Any) -> None:
    """narwhals without its Dask support raises a bare TypeError: refused typed, naming the
    plugin to install."""
    import narwhals as nw

    def moved(native: Any, **kwargs: Any) -> Any:
        raise TypeError("Unsupported dataframe type")

    monkeypatch.setattr(nw, "from_native", moved)
    with pytest.raises(dp.InvalidTypeError, match="narwhals-dask"):
        table(_acc(), dd.from_pandas(small_table(0), npartitions=2), dataset="events")


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                    reason="distributed is not installed")
def test_each_worker_removes_the_copy_s_folder(monkeypatch: Any) -> None:
    """Under a distributed client the folder is removed on every worker, not only the client:
    with the client's own removal disabled (a client that does not see the workers' /tmp), no
    worker still holds the folder after the query. Negative control: without the workers'
    removal, the workers hold it."""
    from distributed import Client, LocalCluster
    pdf = small_table(6, units=10, max_rows=3).rename(columns={"unit": PERSON})
    folders: list[str] = []
    real = on_dask.tempfile.mkdtemp

    def made(**kwargs: Any) -> str:
        folders.append(real(**kwargs))
        return folders[-1]

    def query() -> Any:
        return table(_acc(), dd.from_pandas(pdf, npartitions=2), dataset="events").count(
            epsilon=1.0, max_rows_per_unit=3).release()

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        with dask.config.set(scheduler=None), monkeypatch.context() as m:
            m.setattr(on_dask.tempfile, "mkdtemp", made)
            m.setattr(on_dask.shutil, "rmtree", lambda *a, **k: None)  # (client side only)
            query()
            assert not any(client.run(os.path.exists, folders[-1]).values())
            m.setattr(on_dask, "_on_workers", lambda folder: None)
            query()
            assert all(client.run(os.path.exists, folders[-1]).values())
        client.run(on_dask._remove, folders[-1])
