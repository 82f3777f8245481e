"""Table queries per privacy unit: a frame (pandas, Polars, DuckDB, Parquet/CSV), bounded per unit
in its own engine, released through the gate as one step (``dpbudget.table``)."""
