"""Replay: move the report cursor back (consumer reset), then consume the aggregate again.

Use it for backfills after a bug fix in the consumer: pick the stream sequence or the time to
replay from; the consume job then re-reads everything past the reset cursor and overwrites its
output folder ``replay-<run key>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Param, task
from orders_pipeline_common import (
    AGG_STREAM,
    CURSOR_CONSUMER,
    NATS_CONN_ID,
    OUTPUT_DIR,
    SPARK_APPS,
    SPARK_CONF,
    run_key,
)

from airflow_jetstream.operators.consumer import JetStreamConsumerResetOperator
from airflow_jetstream.operators.spark_submit import JetStreamSparkSubmitOperator

with DAG(
    dag_id="jetstream_orders_replay",
    description="Reset the orders report cursor and re-consume the aggregate stream",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    schedule=None,
    catchup=False,
    params={
        "from_seq": Param(1, type=["integer", "null"], description="replay from this stream sequence"),
        "from_time": Param(None, type=["string", "null"], description="or from this time (ISO 8601)"),
        "output_dir": Param(OUTPUT_DIR, type="string"),
    },
    render_template_as_native_obj=True,
    user_defined_filters={"run_key": run_key},
    tags=["jetstream", "spark", "example", "replay"],
) as dag:
    reset = JetStreamConsumerResetOperator(
        task_id="reset_report_cursor",
        stream=AGG_STREAM,
        consumer=CURSOR_CONSUMER,
        start_seq="{{ params.from_seq if not params.from_time else None }}",
        start_time="{{ params.from_time }}",
    )
    reconsume = JetStreamSparkSubmitOperator(
        task_id="reconsume_orders",
        application=str(SPARK_APPS / "consume_orders.py"),
        nats_conn_id=NATS_CONN_ID,
        stream=AGG_STREAM,  # the task's JetStream extra link opens the view at this stream
        ship_package=True,
        application_args=[
            "--stream", AGG_STREAM, "--cursor", CURSOR_CONSUMER,
            "--run-id", "{{ run_id }}", "--output", "{{ params.output_dir }}/replay-{{ run_id | run_key }}",
        ],
        conf=SPARK_CONF,
        conn_id="spark_default",
        name="replay-orders",
    )

    @task
    def report(params: dict, run_id: str, ti=None) -> dict:
        """What the replay re-read, also written to ``<output_dir>/replay_summary.json``."""
        root = Path(params["output_dir"])
        consumed = json.loads((root / f"replay-{run_key(run_id)}" / "consume_summary.json").read_text())
        reset_result = ti.xcom_pull(task_ids="reset_report_cursor") or {}
        summary = {
            "replayed_from_seq": reset_result.get("reset_seq"),
            "rows_consumed": consumed["rows_consumed"],
            "distinct_orders": consumed["distinct_orders"],
            "output_path": consumed["output_path"],
        }
        (root / "replay_summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    reset >> reconsume >> report()
