"""The values every layer shares: ``Budget``, ``Charge``, the error tree, the Rényi curves, and the
arithmetic that rounds to the safe side. Nothing here knows a ledger, a rule or a mechanism."""
