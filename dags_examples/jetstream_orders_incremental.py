"""Incremental streaming per schedule: every hour, a Structured Streaming query with
Trigger.AvailableNow reads the orders that arrived in the hour and writes the large ones to
``ORDERS_LARGE`` with the exactly-once sink, then stops until the next run.

The schedule is a ``CronDataIntervalTimetable``: each run's data interval is the hour before it starts
(10:00 to 11:00 for the run at 11:00), as the UI shows it. A cron string alone would get Airflow 3's
default ``CronTriggerTimetable``, whose runs have an interval of length 0 (start == end).

Each run reads exactly what was stored before its interval's end and after the previous run's
(its checkpoint starts as a copy of the previous run's, ``end_time`` stops it at the interval's
end); a run after hours without a run (Airflow stopped; ``catchup=False``) reads those hours too;
clearing a run and running it again stores nothing twice (docs/streaming.md explains why).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable
from orders_pipeline_common import (
    AGG_STREAM,
    AGG_STREAM_CONFIG,
    NATS_CONN_ID,
    OUTPUT_DIR,
    REPLICAS,
    SPARK_APPS,
    SPARK_CONF,
)

from airflow_jetstream.operators.spark_submit import JetStreamSparkSubmitOperator
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator

LARGE_STREAM = "ORDERS_LARGE"
#: Where the runs' checkpoints live: a path every Spark driver of the DAG can reach (local for the demo).
CHECKPOINTS = os.environ.get("JETSTREAM_DEMO_CHECKPOINTS", f"{OUTPUT_DIR}/checkpoints/orders-large")

with DAG(
    dag_id="jetstream_orders_incremental",
    description="Hourly incremental streaming step: large orders from ORDERS_AGG to ORDERS_LARGE, exactly once",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"),
    catchup=False,
    max_active_runs=1,
    # a run starts from the previous run's checkpoint: the intervals run in order
    default_args={"depends_on_past": True},
    tags=["jetstream", "spark", "example", "streaming"],
) as dag:
    ensure_source = JetStreamEnsureStreamOperator(task_id="ensure_agg_stream", config=AGG_STREAM_CONFIG)
    ensure_target = JetStreamEnsureStreamOperator(
        task_id="ensure_large_stream",
        config={"name": LARGE_STREAM, "subjects": ["orders.large.>"], "allow_atomic": True,
                "duplicate_window": "10m", "max_age": "30d", "num_replicas": REPLICAS},
    )
    step = JetStreamSparkSubmitOperator(
        task_id="stream_large_orders",
        application=str(SPARK_APPS / "stream_orders.py"),
        nats_conn_id=NATS_CONN_ID,
        stream=LARGE_STREAM,  # the task's JetStream extra link opens the view at this stream
        ship_package=True,
        application_args=[
            "--from-stream", AGG_STREAM, "--to-stream", LARGE_STREAM, "--checkpoints", CHECKPOINTS,
            "--interval-end", "{{ data_interval_end | ts }}",
        ],
        conf=SPARK_CONF,
        conn_id="spark_default",
    )
    [ensure_source, ensure_target] >> step
