"""Reading a ledger after the fact: the audit (replay, verify, report), budget status, exports,
logs of committed records, and plots. ``dpbudget.audit`` is the audit itself."""
