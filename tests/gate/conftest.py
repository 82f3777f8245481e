"""The gate's tests use the policy tests' accountants (``make``: an accountant from a policy text,
seeded, on a settable clock; ``untouched``: nothing changed; ``other_rule``): the same fixtures,
imported, not copied."""

from tests.policies.conftest import clock, make, other_rule, untouched  # noqa: F401
