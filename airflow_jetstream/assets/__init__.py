"""Airflow assets (``jetstream://``) for data-aware scheduling and lineage."""

from airflow_jetstream.assets.jetstream import InvalidAssetURIError, jetstream_asset

__all__ = ["InvalidAssetURIError", "jetstream_asset"]
