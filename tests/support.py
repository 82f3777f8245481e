"""Small helpers shared by test modules (importable as ``tests.support``)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpbudget.accountant import cli
from dpbudget.accountant.ledger import GENESIS, Ledger
from dpbudget.accountant.ledger.base import Entry
from dpbudget.accountant.ledger.record import (AccountLayout, assemble, canonical, record_hash,
                                              step_fragments, utc_time)

SEED = 20261121


def utc_now() -> str:
    """Now by this process's wall clock, as ``utc_time`` writes a record's time."""
    return utc_time(time.time_ns() // 1000)


def snapshot(ledger: Ledger, rng: np.random.Generator | None = None) -> tuple[Any, ...]:
    """Everything a request may not change when it is refused: every committed record, every
    account, the head, and the random generator's state."""
    entries = [(e.seq, e.text, e.hash) for e in ledger.entries()]
    accounts = [(a.key, a.rule, copy.deepcopy(a.config), dict(a.state), a.seq)
                for a in ledger.accounts()]
    state = None if rng is None else copy.deepcopy(rng.bit_generator.state)
    return entries, accounts, ledger.head(), state


def charged_accounts(acc: Any, dataset: Any = "default", analyst: str | None = None) -> list[str]:
    """The account keys a release on ``dataset`` by ``analyst`` is charged to, read back from the
    ledger record of a tiny release (it spends ε = 1e-9 of each)."""
    from dpbudget.mechanisms import Laplace

    acc.release(Laplace(1e-9, sensitivity=1.0), 0.0, dataset=dataset, analyst=analyst)
    return sorted(json.loads(list(acc.ledger.entries())[-1].text)["accounts"])


def release_fields(mechanism: Any, dataset: str, accounts: list[tuple[Any, Any]]) -> dict[str, str]:
    """A release record's members, as ``Transaction.append`` takes them, for ``(rule, Account)``
    pairs: for tests that forge ledgers (the format is documented in ``ledger/record.py``)."""
    return {"kind": '"release"', "analyst": "null", "label": "null",
            **step_fragments(mechanism.name, mechanism.params(), mechanism.charge),
            "accounts": assemble({a.key: AccountLayout(rule.describe()).text(a.state)
                                  for rule, a in accounts}),
            "dataset": canonical(dataset)}


def assert_chain(ledger: Ledger) -> int:
    """Check the whole hash chain independently of the library; return the number of records
    other than policy records (a durable ledger's first record states its policy).

    One chain (format 1): records 1, 2, ... each naming the hash of the one before. Lanes (format
    2, a PostgreSQL ledger): increasing numbers, and each record links, for every account it lists
    and every other lane it names, to the last record seen on that lane."""
    prev, last, n, policies, in_lanes = GENESIS, 0, 0, 0, False
    lanes: dict[str, list[Any]] = {}
    for n, entry in enumerate(ledger.entries(), start=1):
        assert entry.hash == hashlib.sha256(entry.text.encode("utf-8")).hexdigest()
        record = json.loads(entry.text)
        assert record["seq"] == entry.seq > last
        if "links" in record:
            assert record["v"] == 2 and "prev" not in record and "table" not in record
            assert set(record.get("accounts") or {}) <= set(record["links"])
            for key, link in record["links"].items():
                assert link == lanes.get(key, [0, GENESIS]), (entry.seq, key)
            for key, link in record.get("reads", {}).items():  # read, not moved
                assert key not in record["links"] and link == lanes.get(key, [0, GENESIS])
            on, in_lanes = list(record["links"]), True
        else:
            assert not in_lanes  # one chain never follows lanes
            assert entry.seq == n and record["prev"] == prev and record["v"] == 1
            on = list(record.get("accounts") or {})
        for key in on:
            lanes[key] = [entry.seq, entry.hash]
        assert json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False) == entry.text
        prev, last = entry.hash, entry.seq
        policies += record.get("kind") == "policy"
    assert ledger.head() == ((last, prev) if n else (0, GENESIS))
    return n - policies


def release_entries(ledger: Ledger) -> list[Any]:
    """The ledger's entries other than policy records."""
    return [e for e in ledger.entries() if json.loads(e.text).get("kind") != "policy"]


#: A module defining a custom mechanism, ``Halver`` (ε = 0.5, halves its value), for tests that
#: write it to a file and import it by its qualified name.
HALVER_MODULE = ("from dpbudget.accountant import Budget\nfrom dpbudget.mechanisms import NumericMechanism\n"
                 "class Halver(NumericMechanism):\n"
                 "    def __init__(self):\n        self.declare(Budget(0.5))\n"
                 "    def params(self):\n        return {}\n"
                 "    def draw(self, value, sampler):\n        return value / 2\n")


def __getattr__(name: str) -> Any:
    """``OWNER``: the ledger owner key (``dpbudget.accountant.gate.owner_key.OwnerKey``) of the tests' ledgers
    whose policy a test changes: the same in every process (a test's child processes open the
    ledgers its parent created), made on first use (needs ``cryptography``)."""
    if name != "OWNER":
        raise AttributeError(name)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from dpbudget.accountant.gate.owner_key import OwnerKey

    seed = hashlib.sha256(b"dpbudget tests: the ledger owner").digest()
    globals()["OWNER"] = key = OwnerKey(Ed25519PrivateKey.from_private_bytes(seed))
    return key
class LedgerTime:
    """Stands in for the ``time`` module inside ``dpbudget.accountant.ledger.base``: the wall clock a
    durable (SQLite) ledger reads for its transactions' times, set by a test. Not a public API:
    the library takes no clock for a durable ledger (``Accountant.from_policy``)."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock

    def time(self) -> float:
        return float(self.clock())

    def time_ns(self) -> int:
        return round(self.clock() * 1e9)


def set_ledger_clock(clock: Any, monkeypatch: Any = None) -> None:
    """Make SQLite ledgers of this process read ``clock`` as their wall clock (``monkeypatch``:
    undone after the test; without it, for a process of the test's own, such as a spawned one)."""
    import dpbudget.accountant.ledger.base as base

    if monkeypatch is None:
        base.time = LedgerTime(clock)  # type: ignore[assignment]
    else:
        monkeypatch.setattr(base, "time", LedgerTime(clock))


def records(acc: Any) -> list[dict[str, Any]]:
    """Every record of an accountant's ledger, parsed, in order."""
    return [e.record for e in acc.ledger.entries()]


def replay_ledger(ledger: Ledger) -> int:
    """Replay every record's debit from an empty state under its account's own rule and check
    each state written and the final account table; return how many account steps were replayed."""
    from dpbudget.accountant.composition import Charge, rule_from_config

    states: dict[str, dict[str, Any]] = {}
    n = 0
    for entry in ledger.entries():
        rec = entry.record
        cost = rec["cost"]
        charge = Charge(cost["epsilon"], cost["delta"], cost["rho"], cost["mu"])
        for key, account in rec["accounts"].items():
            config = {k: v for k, v in account.items() if k != "state"}
            rule = rule_from_config(config)
            before = states.get(key, rule.initial_state())
            assert rule.debit(before, charge) == account["state"], (rec["seq"], key)
            states[key] = account["state"]
            n += 1
    assert states == {a.key: a.state for a in ledger.accounts()}
    return n


def load_policy_text(text: str) -> Any:
    """A ``Policy`` from TOML text (validated as a policy file is)."""
    import tomllib

    from dpbudget.policies.policy import Policy

    return Policy.model_validate(tomllib.loads(text))


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``dpbudget *argv`` in process: its exit status, stdout and stderr (an exception raised
    here is the traceback a test forbids)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def errors_in_threads(work: Callable[[], None], n: int = 4) -> list[BaseException]:
    """Runs ``work`` in ``n`` threads at once and returns what any of them raised (a test asserts
    it is empty: an exception in a thread would otherwise pass unseen)."""
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            work()
        except BaseException as exc:  # pragma: no cover - reported to the caller
            errors.append(exc)

    threads = [threading.Thread(target=guarded) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def forge_release(ledger: Any, mechanism: Any, rule: Any, account: Any, dataset: str = "d") -> None:
    """Writes a release of ``mechanism`` and the account row it leaves straight into ``ledger``,
    below the gate (no check): a forgery for the audit to flag. Call it inside
    ``ledger.transaction()``; the record chains onto the head like a real one."""
    text = release_fields(mechanism, dataset, [(rule, account)])
    seq, head = ledger._head()
    body = assemble({**text, "v": "1", "seq": str(seq + 1), "prev": f'"{head}"',
                     "time": utc_now(), "auth": '"sha256"'})
    ledger._write_entry(Entry(seq + 1, body, record_hash(body)))
    ledger._write_accounts([account._replace(seq=seq + 1)])


def import_one_release(url: str, folder: Any, epsilon: float) -> None:
    """Fills the new ledger at ``url`` like one from before stored policies: one Laplace release
    at ``epsilon`` on "people" from an in-memory accountant (which records no policy), exported to
    ``folder``/old.jsonl and imported."""
    from dpbudget.accountant import Accountant, Budget
    from dpbudget.accountant.audit.transfer import export_jsonl, import_jsonl
    from dpbudget.accountant.ledger import open_ledger
    from dpbudget.mechanisms import Laplace

    memory = Accountant(Budget(1.0))
    memory.release(Laplace(epsilon, sensitivity=1.0), 1.0, dataset="people")
    export_jsonl(memory.ledger, folder / "old.jsonl")
    with open_ledger(url) as ledger:
        import_jsonl(folder / "old.jsonl", ledger)
