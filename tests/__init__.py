"""dpbudget's test suite (a package, so that test modules can share ``tests.contracts``)."""
