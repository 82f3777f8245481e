"""The ledger's record format (version 1) and its hash chain.

A record is a JSON object written canonically (sorted keys, no insignificant white space, UTF-8,
no NaN/Infinity), so that the same record always has the same bytes. Each record carries the hash of
the one before it (``prev``; the first carries ``GENESIS``), and its own hash is the SHA-256 of its
canonical bytes, so editing, deleting, inserting or reordering any record breaks the chain from that
record on. Records never contain the true value of a query.

Fields of a release record: ``v`` (format version), ``seq`` (1, 2, ...), ``time`` (UTC, ISO 8601),
``kind`` (``"release"``), ``dataset``, ``analyst``, ``label``, ``mechanism`` (``name`` and public
``params``), ``cost`` (``epsilon``, ``delta``, ``rho``, ``mu``: the declared charge), ``accounts``
(for every limit the step was charged to: the rule's configuration and the state after the debit),
and ``prev``.

Invariant of every record that debits (an auditor replays on it): ``cost`` is exactly the charge
given to ``rule.debit(state, charge)`` for EVERY account listed in ``accounts``; a step that would
need different charges for different accounts is written as several records. Additional members:

- a release on several datasets (a join): ``dataset`` is the first named, ``datasets`` all of them;
- a release inside a pipeline: ``pipeline`` (its id); ``accounts`` is the pipeline's account only;
- ``kind = "pipeline"`` (a pipeline opened): ``pipeline`` (its id, ``<name>#<seq>``), ``parent``
  (the enclosing pipeline's id, or null), ``rule`` (the pipeline's own rule configuration),
  ``cost`` (its allocation) and ``accounts`` (the parent accounts it was debited from); no
  ``mechanism``.

Account keys (``policies.accounts``): ``global``, ``dataset:NAME``, ``dataset:NAME/analyst:WHO``,
``analyst:WHO``, ``pipeline:ID``; a renewal window's account adds ``@<start>+<period>``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

FORMAT_VERSION = 1
GENESIS = "0" * 64

__all__ = ["FORMAT_VERSION", "GENESIS", "assemble", "canonical", "record_hash"]


# One encoder for the process: json.dumps with non-default options builds a new encoder per call,
# which is most of the cost of writing a record.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                            allow_nan=False)


# The encoder's own string escaper (C, no ASCII escaping), used directly for keys and strings.
_string = json.encoder.encode_basestring


def canonical(record: Any) -> str:
    """The canonical JSON text of a record (or of any JSON value)."""
    if record is None:
        return "null"
    return _string(record) if isinstance(record, str) else _ENCODER.encode(record)


def assemble(fragments: dict[str, str]) -> str:
    """The canonical text of an object whose members are given as canonical JSON texts.

    Equal to ``canonical({k: json.loads(v) for k, v in fragments.items()})``, without re-encoding
    members that never change (a mechanism's parameters, a rule's configuration): those are encoded
    once and reused, which is what keeps a debit cheap.
    """
    return "{" + ",".join([f"{_string(k)}:{fragments[k]}" for k in sorted(fragments)]) + "}"


def record_hash(text: str) -> str:
    """SHA-256 (hex) of a record's canonical text; the record includes the previous hash."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
