"""The ledger's record format (version 1) and its hash chain.

A record is a JSON object written canonically (sorted keys, no insignificant white space, UTF-8,
no NaN/Infinity), so that the same record always has the same bytes. Each record carries the hash of
the one before it (``prev``; the first carries ``GENESIS``), and its own hash is the SHA-256 of its
canonical bytes, so editing, deleting, inserting or reordering any record breaks the chain from that
record on. Records never contain the true value of a query. Their members are encoded here alone,
from values (``RecordKind``, ``noise_member``, ``accounts_member``, ``step_fragments``...): the
gate and the others pass values, never JSON text of their own.

A plain SHA-256 chain shows accidental or naive edits, but whoever can write the file can also
rebuild every hash after an edit. With a secret key (from the environment variable
``DPBUDGET_LEDGER_KEY``, or passed to the ledger) each hash is instead HMAC-SHA256(key, record), and
the record says so (``"auth": "hmac-sha256"``): without the key a forger cannot produce a chain that
verifies, and an auditor who holds the key treats any unkeyed record as forged.

Fields of a release record: ``v`` (format version), ``seq`` (1, 2, ...), ``time`` (UTC, ISO 8601),
``auth`` (``"sha256"`` or ``"hmac-sha256"``), ``kind`` (``"release"``), ``dataset``, ``analyst``, ``label``, ``mechanism`` (``name`` and public
``params``), ``cost`` (``epsilon``, ``delta``, ``rho``, ``mu``: the declared charge; ``rdp``, the
Rényi curve ``[kind, parameters...]``, only when the mechanism declares one), ``accounts``
(for every limit the step was charged to: the rule's configuration and the state after the debit),
``noise`` (which noise was drawn: ``exact-csprng``, ``exact-seeded``, ``float-csprng`` or
``float-seeded``; a batch with any float member says float; records written before this member
existed have none, and the audit counts them as ``unrecorded``), ``writer`` (``id``: a random
id of this process's writer of this ledger, new in each process; ``n``: that writer's count of records,
1, 2, ...; absent from records written before this member existed; ``dpbudget.accountant.ledger.writer``),
and ``prev``. (Durable records of earlier versions also carry ``table``, read as nothing.)

Invariant of every record that debits (an auditor replays on it): ``cost`` is exactly the charge
given to ``rule.debit(state, charge)`` for EVERY account listed in ``accounts``; a step that would
need different charges for different accounts is written as several records. Additional members:

- the first record of a ledger created for simulation (``Accountant(..., simulation=True)``; its
  policy record): ``"simulation": true``. Only then does a durable ledger take seeded noise
  (``noise`` ending in ``-seeded``); the audit reports seeded noise anywhere else
  (``Ledger.simulation``). No other record carries the member, so a ledger never becomes one
  later, nor stops being one;
- a release on several datasets (a join): ``dataset`` is the first named, ``datasets`` all of them;
- a release inside a pipeline: ``pipeline`` (its id); ``accounts`` is the pipeline's account only;
- ``kind = "pipeline"`` (a pipeline opened): ``pipeline`` (its id, ``<name>#<seq>``), ``parent``
  (the enclosing pipeline's id, or null), ``rule`` (the pipeline's own rule configuration),
  ``cost`` (its allocation) and ``accounts`` (the parent accounts it was debited from); no
  ``mechanism``.

Account keys (``dpbudget.policies.accounts``): ``global``, ``dataset:NAME``, ``dataset:NAME/analyst:WHO``,
``analyst:WHO``, ``pipeline:ID``; a renewal window's account adds ``@<start>+<period>``.
- a table query's release (``gate.bounded``): ``unit`` (its unit column, or null) and ``bounds``;
- ``kind = "session"`` (a sparse-vector session opened, Accountant.session): like a release, its
  whole fixed cost debited once; when closed, a record of ``kind = "session-close"`` with zero
  ``cost`` and empty ``accounts`` (no state changes), ``session`` (the seq of the opening record),
  ``answered`` and ``positives`` (counts of queries and of ⊤ answers, never values).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.values.errors import InvalidArgumentError
from dpbudget.accountant.ledger.entry import Account

FORMAT_VERSION = 1
GENESIS = "0" * 64
KEY_ENV = "DPBUDGET_LEDGER_KEY"

__all__ = ["FORMAT_VERSION", "GENESIS", "KEY_ENV", "ZERO_COST", "AccountLayout", "RecordKind",
           "accounts_member", "assemble", "auth_name", "canonical", "charge_from_record",
           "charge_record", "export_line", "key_from_env", "noise_member", "record_hash",
           "step_fragments", "time_micros", "utc_time"]


# One encoder for the process (json.dumps with options builds one per call: most of a record's cost).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                            allow_nan=False)

# The encoder's own string escaper (C, no ASCII escaping), used directly for keys and strings.
_string = json.encoder.encode_basestring


def canonical(record: Any) -> str:
    """The canonical JSON text of a record (or of any JSON value)."""
    if record is None:  # (an unnamed analyst or label: on every release's path)
        return "null"
    return _string(record) if isinstance(record, str) else _ENCODER.encode(record)


def assemble(fragments: dict[str, str]) -> str:
    """The canonical text of an object whose members are given as canonical JSON texts.

    Equal to ``canonical({k: json.loads(v) for k, v in fragments.items()})``, without re-encoding
    members that never change (a mechanism's parameters, a rule's configuration): those are encoded
    once and reused, which is what keeps a debit cheap.
    """
    layout = _LAYOUTS.get(tuple(fragments))
    if layout is None:
        if len(_LAYOUTS) > 1024:  # member sets are few (one per record kind); stay bounded anyway
            _LAYOUTS.clear()
        layout = _LAYOUTS[tuple(fragments)] = tuple((f"{_string(k)}:", k) for k in sorted(fragments))
    return "{" + ",".join([name + fragments[k] for name, k in layout]) + "}"


# The sorted, encoded member names for each member set seen (records of a kind share one).
_LAYOUTS: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {}


class RecordKind(Enum):
    """A record's ``kind``; ``text`` is its member as written (canonical JSON), encoded once."""

    RELEASE = "release"
    SESSION = "session"
    SESSION_CLOSE = "session-close"
    PIPELINE = "pipeline"
    POLICY = "policy"

    def __init__(self, value: str) -> None:
        self.text = _string(value)


def noise_member(kind: str, source: str) -> str:
    """A record's ``noise``: the noise kind (``"exact"``, ``"float"``) drawn from ``source``
    (``"csprng"``, ``"seeded"``), e.g. ``"exact-csprng"``."""
    text = _NOISE.get(kind + source)  # (the four documented values, encoded once)
    return _string(f"{kind}-{source}") if text is None else text


_NOISE = {k + s: _string(f"{k}-{s}") for k in ("exact", "float") for s in ("csprng", "seeded")}


def accounts_member(targets: Sequence[Any], accounts: Sequence[Account]) -> str:
    """A record's ``accounts``: each account's key and its state laid out by its target's
    ``layout`` (an ``AccountLayout``), ``targets[i]`` for ``accounts[i]``."""
    if len(accounts) == 1:  # the common case, without sorting or a layout lookup
        one = accounts[0]
        layout: AccountLayout = targets[0].layout  # (a target is the gate's: typed Any here)
        return "{" + _string(one.key) + ":" + layout.text(one.state) + "}"
    return assemble({a.key: t.layout.text(a.state) for t, a in zip(targets, accounts)})


def float_object(values: Mapping[str, float]) -> str:
    """Canonical JSON of an object of finite floats with plain ASCII names (a rule's state),
    without the general encoder: json writes a float as ``repr(float)``, so the text is the same.
    """
    return "{" + ",".join([f'"{k}":{float(values[k])!r}' for k in sorted(values)]) + "}"


def charge_record(charge: Charge) -> dict[str, Any]:
    """A charge as a record's ``cost`` member (an auditor replays from it)."""
    out: dict[str, Any] = {"epsilon": charge.epsilon, "delta": charge.delta, "rho": charge.rho,
                           "mu": charge.mu}
    if charge.parts:
        out["parts"] = [charge_record(p) for p in charge.parts]
    if charge.rdp is not None:  # only when declared: records without a curve keep their bytes
        out["rdp"] = list(charge.rdp)
    return out


def charge_from_record(cost: Mapping[str, Any], mechanism: str = "") -> Charge:
    """The charge a record's ``cost`` member describes (inverse of ``charge_record``).

    Raises:
        KeyError, TypeError, ValueError: a malformed ``cost`` (the auditor reports it).
    """
    def opt(x: Any) -> float | None:
        return None if x is None else float(x)

    curve = cost.get("rdp")
    return Charge(float(cost["epsilon"]), float(cost["delta"]), opt(cost.get("rho")),
                  opt(cost.get("mu")), mechanism,
                  tuple(charge_from_record(p) for p in cost.get("parts") or ()),
                  None if curve is None else (str(curve[0]), *(float(x) for x in curve[1:])))


ZERO_COST = canonical({"epsilon": 0.0, "delta": 0.0, "rho": None, "mu": None})

# Encoded descriptions by (name, parameters, charge): building a fresh mechanism per release is
# the common usage, and its description depends only on these.
_STEPS: dict[tuple[Any, ...], dict[str, str]] = {}


def step_fragments(name: str, params: dict[str, Any], charge: Charge) -> dict[str, str]:
    """The ``mechanism`` and ``cost`` members of a record, as canonical JSON (cached by value)."""
    try:
        key: tuple[Any, ...] | None = (name, tuple(params.items()), charge)
        cached = _STEPS.get(key)  # type: ignore[arg-type]
    except TypeError:  # unhashable parameters (candidate lists): encode each time
        key = cached = None
    if cached is None:
        try:
            cached = {"mechanism": canonical({"name": name, "params": params}),
                      "cost": canonical(charge_record(charge))}
        except (TypeError, ValueError):  # NaN/inf (an overflowed scale) or a non-JSON value
            raise InvalidArgumentError(
                "mechanism", name, "a mechanism whose public parameters are finite numbers, "
                "strings, booleans or lists of them (they are written to the ledger)",
                "nothing was drawn or debited") from None
        if key is not None:
            if len(_STEPS) > 4096:
                _STEPS.clear()
            _STEPS[key] = cached
    return cached


class AccountLayout:
    """The text of one account in a record's ``accounts`` member — a rule's configuration plus
    its state — with the configuration laid out once (this is on every debit's path)."""

    __slots__ = ("_prefix", "_suffix")

    def __init__(self, config: Mapping[str, Any]) -> None:
        fragments = {k: canonical(v) for k, v in config.items()}
        self._prefix, self._suffix = assemble({**fragments, "state": "\0"}).split("\0")

    def text(self, state: Mapping[str, float]) -> str:
        return self._prefix + float_object(state) + self._suffix


def record_hash(text: str, key: bytes | None = None) -> str:
    """The chain hash (hex) of a record's canonical text, which includes the previous hash:
    SHA-256, or HMAC-SHA256 under ``key`` (RFC 2104)."""
    data = text.encode("utf-8")
    if key is None:
        return hashlib.sha256(data).hexdigest()
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def auth_name(key: bytes | None) -> str:
    return "sha256" if key is None else "hmac-sha256"


def key_from_env() -> bytes | None:
    """The ledger key from ``DPBUDGET_LEDGER_KEY`` (any string; its UTF-8 bytes), or None."""
    value = os.environ.get(KEY_ENV)
    return value.encode("utf-8") if value else None


def export_line(digest: str, text: str) -> str:
    """One JSONL line of an export or a log: ``{"hash": ..., "record": {...}}``. The record is the
    canonical text itself, so re-encoding the parsed record reproduces the hashed bytes."""
    return f'{{"hash":"{digest}","record":{text}}}'


# (whole second, its ISO prefix), reused within the same second; replaced whole (atomic), since
# threads may format times of different seconds at once.
_clock: list[tuple[int, str]] = [(-1, "")]


def utc_time(micros: int) -> str:
    """A time in whole microseconds since the epoch, as a JSON string in ISO 8601 UTC with
    microseconds (a record's ``time``; the date part formatted once per second: it is on the hot
    path). ``time_micros`` reads it back exactly, so a record's time is the very instant its
    windows and blocks were computed from (``dpbudget.accountant.ledger.transaction``)."""
    second, micros = divmod(micros, 1_000_000)
    cached = _clock[0]
    if cached[0] != second:
        stamp = datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        cached = _clock[0] = (second, stamp)
    return f'"{cached[1]}.{micros:06d}+00:00"'


def time_micros(text: str) -> int:
    """A record's ``time`` (the string, without its JSON quotes) in whole microseconds since the
    epoch: the inverse of ``utc_time``.

    Raises:
        ValueError: not an ISO 8601 time with a UTC offset (the audit reports it as malformed).
    """
    if not isinstance(text, str):
        raise ValueError("a record's time must be an ISO 8601 string")
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError("a record's time must state its UTC offset")
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
