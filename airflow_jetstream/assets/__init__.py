"""Airflow assets (``jetstream://``) for data-aware scheduling and lineage."""

from airflow_jetstream.assets.jetstream import jetstream_asset, kv_asset, report_stream_input, report_stream_output

__all__ = ["jetstream_asset", "kv_asset", "report_stream_input", "report_stream_output"]
