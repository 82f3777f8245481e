"""Runnable example pipelines and the bundled sample data set (installed as ``dpbudget.examples``)."""
