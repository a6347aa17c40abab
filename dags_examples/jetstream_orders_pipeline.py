"""Orders pipeline: Spark produces into JetStream, durable sourcing aggregates, Spark consumes.

    ensure streams -> durable source ORDERS_RAW -> ORDERS_AGG
      -> SparkSubmitOperator produce (atomic batches + batch ledger)
      -> sensors: batches published, source caught up, no batch abandoned
      -> SparkSubmitOperator consume (bounded read, cursor advanced after the Parquet is written)
      -> ledger says consumed -> report

The Spark jobs get the ``nats_default`` connection (servers and credentials) from
JetStreamSparkSubmitOperator, never on a command line, and the provider's package shipped with
``--py-files`` (executors need only pyspark). Run it with ``make demo`` (embedded nats-server, Spark
local[2]), ``make demo-cluster`` (3-node NATS cluster with auth, Spark standalone cluster) or in any
deployment that has a ``nats_default`` and a ``spark_default`` connection.
"""

from __future__ import annotations

import json
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Param, task
from orders_pipeline_common import (
    AGG_ASSET,
    AGG_STREAM,
    AGG_STREAM_CONFIG,
    CAPTURE_STREAM,
    CLAIM_DEADLINE,
    CURSOR_CONSUMER,
    LEDGER_ASSET,
    LEDGER_BUCKET,
    NATS_CONN_ID,
    OUTPUT_DIR,
    RAW_ASSET,
    RAW_STREAM,
    RAW_STREAM_CONFIG,
    SPARK_APPS,
    SPARK_CONF,
    run_key,
)

from airflow_jetstream.operators.advisory import JetStreamAdvisoryStreamOperator
from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator
from airflow_jetstream.operators.spark_submit import JetStreamSparkSubmitOperator
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator
from airflow_jetstream.sensors.advisory import JetStreamAdvisorySensor
from airflow_jetstream.sensors.consumer import JetStreamSourceCaughtUpSensor
from airflow_jetstream.sensors.ledger import JetStreamBatchLedgerSensor

JOB_ID = "orders-{{ run_id | run_key }}"
RUN_OUTPUT = "{{ params.output_dir }}/{{ run_id | run_key }}"

with DAG(
    dag_id="jetstream_orders_pipeline",
    description="Spark -> JetStream (atomic batches) -> durable sourcing -> Spark, with ledger and advisories",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    schedule=None,
    catchup=False,
    max_active_runs=1,
    params={
        "rows": Param(20_000, type="integer", minimum=1, description="orders the producer generates"),
        "output_dir": Param(OUTPUT_DIR, type="string", description="where the consumer writes Parquet"),
    },
    user_defined_filters={"run_key": run_key},
    tags=["jetstream", "spark", "example"],
) as dag:
    capture = JetStreamAdvisoryStreamOperator(task_id="ensure_advisory_capture", capture_stream=CAPTURE_STREAM,
                                              max_age="1d")
    ensure_raw = JetStreamEnsureStreamOperator(task_id="ensure_raw_stream", config=RAW_STREAM_CONFIG)
    ensure_agg = JetStreamEnsureStreamOperator(task_id="ensure_agg_stream", config=AGG_STREAM_CONFIG)
    source = JetStreamDurableSourceOperator(
        task_id="source_raw_into_agg", stream=AGG_STREAM, source=RAW_STREAM  # server-managed: no consumer options
    )
    produce = JetStreamSparkSubmitOperator(
        task_id="produce_orders",
        application=str(SPARK_APPS / "produce_orders.py"),
        nats_conn_id=NATS_CONN_ID,
        stream=RAW_STREAM,  # the task's JetStream extra link opens the view at this stream
        ship_package=True,
        application_args=[
            "--stream", RAW_STREAM, "--run-id", "{{ run_id }}",
            "--job-id", JOB_ID, "--rows", "{{ params.rows }}", "--ledger-bucket", LEDGER_BUCKET,
        ],
        conf=SPARK_CONF,
        conn_id="spark_default",
        name="produce-orders",
        outlets=[RAW_ASSET, LEDGER_ASSET],
    )
    published = JetStreamBatchLedgerSensor(
        task_id="wait_batches_published", state="published", ledger_bucket=LEDGER_BUCKET, poke_interval=2, timeout=300,
        inlets=[LEDGER_ASSET],
    )
    # the server moves the data: the source's caught-up sensor is where ORDERS_AGG holds the run's orders
    caught_up = JetStreamSourceCaughtUpSensor(
        task_id="wait_source_caught_up", stream=AGG_STREAM, source=RAW_STREAM, poke_interval=1, timeout=300,
        inlets=[RAW_ASSET], outlets=[AGG_ASSET],
    )
    none_abandoned = JetStreamAdvisorySensor(
        task_id="no_batch_abandoned", advisory="batch_abandoned", advisory_stream=RAW_STREAM, expect="absent",
        capture_stream=CAPTURE_STREAM, quiet_period=2, poke_interval=1, timeout=120,
    )
    consume = JetStreamSparkSubmitOperator(
        task_id="consume_orders",
        application=str(SPARK_APPS / "consume_orders.py"),
        nats_conn_id=NATS_CONN_ID,
        stream=AGG_STREAM,  # the task's JetStream extra link opens the view at this stream
        ship_package=True,
        application_args=[
            "--stream", AGG_STREAM, "--cursor", CURSOR_CONSUMER,
            "--run-id", "{{ run_id }}", "--output", RUN_OUTPUT,
            "--ledger-bucket", LEDGER_BUCKET, "--claim-deadline", CLAIM_DEADLINE,
        ],
        conf=SPARK_CONF,
        conn_id="spark_default",
        name="consume-orders",
        inlets=[AGG_ASSET],
        outlets=[LEDGER_ASSET],
    )
    consumed = JetStreamBatchLedgerSensor(
        task_id="wait_batches_consumed", state="consumed", ledger_bucket=LEDGER_BUCKET, poke_interval=2, timeout=300,
        inlets=[LEDGER_ASSET],
    )

    @task
    def report(params: dict, run_id: str, ti=None) -> dict:
        """Summarise the run: rows, messages, batches, output; also written next to the output."""
        from airflow_jetstream.client import fence_count, stream_info
        from airflow_jetstream.hooks.jetstream import JetStreamHook

        root = Path(params["output_dir"])
        output = root / run_key(run_id)
        consumed_summary = json.loads((output / "consume_summary.json").read_text())
        hook = JetStreamHook(nats_conn_id=NATS_CONN_ID)
        agg = hook.run(stream_info, AGG_STREAM)["state"]
        raw = hook.run(stream_info, RAW_STREAM)["state"]
        ledger = ti.xcom_pull(task_ids="wait_batches_consumed") or {}
        summary = {
            "rows_produced": params["rows"],
            "messages_in_aggregate": agg["messages"],
            # the raw stream keeps each chunk's write fence (never sourced): they are not orders left over
            "messages_left_in_raw": raw["messages"] - hook.run(fence_count, RAW_STREAM),
            "batches": ledger.get("batches"),
            "batches_by_state": {k: v for k, v in (ledger.get("states") or {}).items() if v},
            "rows_consumed": consumed_summary["rows_consumed"],
            "distinct_orders": consumed_summary["distinct_orders"],
            "output_path": consumed_summary["output_path"],
        }
        root.mkdir(parents=True, exist_ok=True)
        (root / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    [capture, ensure_raw, ensure_agg] >> source >> produce
    produce >> [published, caught_up, none_abandoned] >> consume >> consumed >> report()
