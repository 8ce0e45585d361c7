"""Trajectory data: one schema (schema.py), batches, and the Arrow/Parquet store. pyarrow only."""
