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

A sparse-vector session (``Accountant.session``) writes the same fields with ``kind`` ``"session"``
when it opens (its whole fixed cost, debited once) and, when it is closed, a record of ``kind``
``"session-close"`` with zero ``cost``, empty ``accounts`` (no state changes), ``session`` (the seq of
the opening record), ``answered`` and ``positives`` (counts of queries and of ⊤ answers, never values).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

FORMAT_VERSION = 1
GENESIS = "0" * 64

__all__ = ["FORMAT_VERSION", "GENESIS", "canonical", "record_hash"]


def canonical(record: dict[str, Any]) -> str:
    """The canonical JSON text of a record."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def record_hash(text: str) -> str:
    """SHA-256 (hex) of a record's canonical text; the record includes the previous hash."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
