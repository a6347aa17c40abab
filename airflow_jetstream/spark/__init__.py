"""PySpark data source ``jetstream``: bounded parallel reads and atomic/fast batch writes.

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

from airflow_jetstream.client.settings import ConnectionSettings, settings_to_fields
from airflow_jetstream.spark.connection import connected_source, session_connection_fields
from airflow_jetstream.spark.failure import record_failures
from airflow_jetstream.spark.package import add_package_to_session, build_py_files
from airflow_jetstream.spark.reader import consume
from airflow_jetstream.spark.source import JetStreamDataSource
from airflow_jetstream.spark.versions import check_pyspark_install


def register(spark: Any, settings: ConnectionSettings | None = None, *, ship_package: bool = False) -> None:
    """Register the ``jetstream`` format with a SparkSession, classic or Spark Connect.

    :param settings: the NATS connection (e.g. ``JetStreamHook("nats_default").settings``): its fields
        become the format's defaults, carried inside the registered data source (pickled into the
        tasks and, on Spark Connect, into the registration), never in Spark conf. Without it, the
        fields of a job submitted by
        :class:`~airflow_jetstream.operators.spark_submit.JetStreamSparkSubmitOperator`
        (``spark.jetstream.*`` conf) are the defaults, if any.
    :param ship_package: first add this package (client + spark, and nats-py) to the session, so
        Python workers that lack it can run the data source: ``spark.addArtifacts(zip, pyfile=True)``
        on Spark Connect, ``SparkContext.addPyFile`` on a classic session. Calling register again
        (with or without it) is safe.
    """
    record_failures(spark)  # in a job of JetStreamSparkSubmitOperator: the cause of a failure, for the task
    check_pyspark_install()
    if ship_package:
        add_package_to_session(spark)
    defaults = session_connection_fields(spark) if settings is None else settings_to_fields(settings)
    spark.dataSource.register(connected_source(JetStreamDataSource, defaults) if defaults else JetStreamDataSource)


__all__ = ["build_py_files", "consume", "register"]
