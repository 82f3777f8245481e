"""Ledger records as logs: every committed record can also go to Python's ``logging``, in the same
JSONL form as ``dpbudget export``, so that a pipeline's logs can be audited like its ledger
(``dpbudget audit pipeline.jsonl``).

The ledger emits each committed record on the logger ``dpbudget.ledger`` at INFO level with the
record attached (``record.dpbudget_entry``), in ``seq`` order within a process; the gate reports
each refused request on its child ``dpbudget.ledger.refusals`` at WARNING level
(``dpbudget.accountant.gate.refusals``). ``JsonlHandler`` writes both — records as ``{"hash":..., "record":...}``
lines, refusals as ``{"refused": {...}}`` lines, which are never part of the chain — and ignores any
other log record. Nothing is emitted (and nothing costs anything) until a handler is attached.

A process's log holds only the records that process wrote: ``dpbudget audit`` checks it alone as
a subsequence of the chain, and merges several (``dpbudget audit a.jsonl b.jsonl``;
``dpbudget.accountant.audit.chain``).

>>> import logging, tempfile, os
>>> from dpbudget.accountant import Accountant, Budget
>>> from dpbudget.mechanisms import Laplace
>>> path = os.path.join(tempfile.mkdtemp(), "records.jsonl")
>>> handler = log_records_to(path)
>>> _ = Accountant(Budget(1.0), rng=0).release(Laplace(0.5, sensitivity=1.0), 3.0)
>>> handler.close(); logging.getLogger(LOGGER_NAME).removeHandler(handler)
>>> with open(path) as f:
...     print(f.read()[:9])
{"hash":"
"""

from __future__ import annotations

import json
import logging
import os

from dpbudget.accountant.ledger.record import export_line
from dpbudget.accountant.values.errors import LedgerError

__all__ = ["LOGGER_NAME", "JsonlHandler", "log_records_to"]

LOGGER_NAME = "dpbudget.ledger"


class JsonlHandler(logging.FileHandler):
    """A file handler that writes ledger records as JSONL lines (``{"hash":..., "record":...}``),
    flushing each line, and skips log records that carry no ledger entry.

    A record's line that cannot be written (a full disk, an I/O error, the handler closed)
    raises, where Python's handlers print a traceback and go on: the ledger keeps the record
    queued and the release that committed it raises ``LedgerUnconfirmedError``, and every later
    debit in the process is refused until the line is written (``dpbudget.accountant.ledger.writer``):
    no record is missing from the log while answers go on. Each line is written whole or not at
    all: the part of a line cut short is cut off again, so its retry does not append to a
    fragment. A refusal's line is a report, not a record: one that fails is reported as Python's
    handlers do (``handleError``). One file per process: a cut line is cut back to where it began.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, mode="a", encoding="utf-8", delay=False)

    def emit(self, record: logging.LogRecord) -> None:
        entry = getattr(record, "dpbudget_entry", None)
        refusal = getattr(record, "dpbudget_refusal", None)
        if entry is not None:  # (written before the release returns: a process that dies
            self._write(export_line(entry.hash, entry.text))  # after it keeps it)
        elif refusal is not None:
            try:  # a refusal's report must never replace the refusal itself
                self._write(json.dumps({"refused": refusal}, sort_keys=True, ensure_ascii=False))
            except Exception:
                self.handleError(record)

    def _write(self, line: str) -> None:
        """Append ``line`` and its newline to the file, whole, past Python's buffer (the file is
        opened for appending: each write lands at its end); a write cut short is truncated back.

        Raises:
            LedgerError: the handler was closed (after ``close`` or ``logging.shutdown``).
            OSError: the write failed.
        """
        stream = self.stream
        if stream is None:
            raise LedgerError("JsonlHandler: closed, it takes no more lines (a record would be "
                              "lost from the log)")
        fd = stream.fileno()
        data = memoryview((line + "\n").encode("utf-8"))
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(fd, data):]
        except BaseException:
            try:
                os.ftruncate(fd, start)
            except OSError:  # (the write's own error is the one to report)
                pass
            raise


def log_records_to(path: str | os.PathLike[str]) -> JsonlHandler:
    """Attach a ``JsonlHandler`` for ``path`` to the ledger logger (level INFO) and return it."""
    handler = JsonlHandler(path)
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    return handler
