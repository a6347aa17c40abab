"""PySpark data source ``jetstream``: bounded parallel reads and atomic/bulk batch writes.

Imports the client toolkit and pyspark, never Airflow, so executors only need this package::

    from airflow_jetstream.spark import register

    register(spark)
    df.write.format("jetstream").mode("append").option("servers", url).option("stream", "ORDERS") \\
        .option("job_id", "orders-2026-01-31").save()
    orders = spark.read.format("jetstream").option("servers", url).option("stream", "ORDERS").load()

See docs/spark.md for the options and guarantees.
"""

from __future__ import annotations

from typing import Any

from airflow_jetstream.spark.reader import Consumption, consume
from airflow_jetstream.spark.source import JetStreamDataSource


def register(spark: Any) -> None:
    """Register the ``jetstream`` format with a SparkSession."""
    spark.dataSource.register(JetStreamDataSource)


__all__ = ["Consumption", "JetStreamDataSource", "consume", "register"]
