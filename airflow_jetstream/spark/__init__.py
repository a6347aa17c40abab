"""PySpark data source ``jetstream``: bounded parallel reads and atomic/bulk batch writes.

Imports the client toolkit and pyspark, never Airflow, so executors only need this package::

    from airflow_jetstream.spark import register

    register(spark)
    df.write.format("jetstream").mode("append").option("servers", url).option("stream", "ORDERS") \\
        .option("job_id", "orders-2026-01-31").save()
    orders = spark.read.format("jetstream").option("servers", url).option("stream", "ORDERS").load()

Submitted with ``JetStreamSparkSubmitOperator(nats_conn_id=...)`` the ``servers`` option and
credentials come from the Airflow connection (see :mod:`airflow_jetstream.spark.connection`).

See docs/spark.md for the options and guarantees.
"""

from __future__ import annotations

from typing import Any

from airflow_jetstream.spark.connection import session_connection_fields
from airflow_jetstream.spark.reader import Consumption, consume
from airflow_jetstream.spark.source import JetStreamDataSource
from airflow_jetstream.spark.versions import check_pyspark_install


def register(spark: Any) -> None:
    """Register the ``jetstream`` format with a SparkSession.

    When the job was submitted with a ``nats`` connection (``spark.jetstream.*`` conf, see
    :class:`~airflow_jetstream.operators.spark_submit.JetStreamSparkSubmitOperator`), its fields
    become the format's defaults: ``servers`` and credentials need not be given as options.
    """
    check_pyspark_install()
    defaults = session_connection_fields(spark)
    source = JetStreamDataSource
    if defaults:
        # A class built here is pickled by value, defaults included, to Spark's Python workers.
        source = type("JetStreamConnectedDataSource", (JetStreamDataSource,), {"connection_defaults": defaults})
    spark.dataSource.register(source)


__all__ = ["Consumption", "JetStreamDataSource", "consume", "register"]
