"""Tests of the ``mechanisms`` package, one module per mechanism family."""
