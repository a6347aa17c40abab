"""``@task.pyspark`` with the ``nats`` connection: the same task on a local session or over Spark Connect.

``jetstream_pyspark_task`` (trigger it manually):

1. ensure the stream ``PYSPARK_ORDERS`` (subjects ``pyspark.orders.>``, atomic batches allowed);
2. a ``@task.pyspark`` task builds its session from the Spark connection ``spark_default`` (of type
   ``spark``: a classic session, e.g. ``local[2]``; of type ``spark_connect``: a Spark Connect
   session; the decorator does not template ``conn_id``), registers the data source with the ``nats`` connection
   ``params.nats_conn_id`` and the package shipped to Spark's Python workers, writes
   ``params.rows`` orders and reads the stream back.

The credentials travel inside the registered data source, never in Spark conf, so the same code
works on both kinds of session; ``ship_package=True`` lets the task run against Python workers
(a Connect server's, a cluster's) that do not have ``airflow-jetstream`` installed.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator

STREAM = "PYSPARK_ORDERS"

with DAG(
    dag_id="jetstream_pyspark_task",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "nats_conn_id": Param("nats_default", type="string"),
        "rows": Param(1000, type="integer", minimum=1),
    },
    tags=["jetstream", "spark"],
):
    ensure = JetStreamEnsureStreamOperator(
        task_id="ensure_stream",
        nats_conn_id="{{ params.nats_conn_id }}",
        config={"name": STREAM, "subjects": ["pyspark.orders.>"], "allow_atomic": True},
    )

    @task.pyspark(conn_id="spark_default")
    def write_and_read(nats_conn_id: str, rows: int, job_id: str, spark: Any = None) -> dict[str, int]:
        from pyspark.sql import functions as F

        from airflow_jetstream.hooks.jetstream import JetStreamHook
        from airflow_jetstream.spark import register

        register(spark, JetStreamHook(nats_conn_id).settings, ship_package=True)
        orders = spark.range(0, int(rows), numPartitions=2).select(
            F.concat(F.lit("pyspark.orders."), (F.col("id") % 4).cast("string")).alias("subject"),
            F.col("id").alias("order_id"),
            (F.col("id") % 100 / 4).alias("amount"),
        )
        orders.write.format("jetstream").mode("append").options(stream=STREAM, job_id=job_id).save()
        read = (spark.read.format("jetstream").schema("order_id long, amount double")
                .options(stream=STREAM, decode="json").load())
        return {"rows_written": int(rows), "orders_in_stream": read.select("order_id").distinct().count()}

    ensure >> write_and_read("{{ params.nats_conn_id }}", "{{ params.rows }}", "pyspark-{{ ts_nodash }}")
