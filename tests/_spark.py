"""One local SparkSession for the tests: local[2], four shuffle partitions, no UI, no progress
bar, quiet logs; started once per test session (the ``spark`` fixture of tests/conftest.py).

When pyspark or a Java runtime is missing the Spark tests are skipped locally, but fail under CI
(``CI=true``), where ``.ci/run`` installs both.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import Any

import pytest

# pyspark 3.5 leaves the loopback socket of each collect to the garbage collector (a
# ResourceWarning in a destructor, an error under this suite's filters): ignored in Spark tests.
MARKS = [pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning")]


def available() -> str | None:
    """None when a session can be started, else the reason it cannot."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install 'dpbudget[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (java) for Spark"
    return None


def session(cores: int = 2) -> Any:
    """A local SparkSession whose Python workers run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(f"local[{cores}]").appName("dpbudget-tests")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.default.parallelism", "4")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.memory", "1g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def frame(spark: Any, data: Any) -> Any:
    """A pandas DataFrame as a Spark one, from its rows and a schema of its dtypes (integers as
    bigint, floats as double, the rest as string): pyspark 3.5's own pandas conversion calls
    functions pandas 3 deprecates (a warning, an error under this suite's filters)."""
    kinds = {"i": "bigint", "u": "bigint", "f": "double", "b": "boolean"}
    schema = ", ".join(f"`{c}` {kinds.get(data[c].dtype.kind, 'string')}" for c in data.columns)
    rows = [tuple(v.item() if hasattr(v, "item") else v for v in row)
            for row in data.itertuples(index=False, name=None)]
    return spark.createDataFrame(rows, schema)
