"""The gate: the one path every noisy answer takes (plan the accounts, debit in one ledger
transaction, then draw), and the objects built on it: ``Accountant``, pipelines, sessions."""
