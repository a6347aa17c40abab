"""Sensors that cost no worker run (``start_from_trigger`` and ``end_from_trigger``) for
tests/test_airflow_deployment.py: the scheduler defers them, the triggerer ends them with their XCom.
``ended_after_a_worker`` is deferred the usual way (a first poke on a worker) and ended by the triggerer."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_jetstream.sensors.consumer import JetStreamConsumerDrainedSensor
from airflow_jetstream.sensors.kv import JetStreamKeyValueSensor
from airflow_jetstream.sensors.ledger import JetStreamBatchLedgerSensor

with DAG(
    dag_id="end_from_trigger_probe",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    schedule=None,
    catchup=False,
    params={"stream": "EFT", "bucket": "EFT"},
    tags=["test"],
):
    ends = {"start_from_trigger": True, "end_from_trigger": True, "poke_interval": 1, "timeout": 600}
    JetStreamConsumerDrainedSensor(task_id="drained", stream="{{ params.stream }}", consumer="A", **ends)
    JetStreamKeyValueSensor(task_id="kv", bucket="{{ params.bucket }}", key="model", value="ready", **ends)
    JetStreamBatchLedgerSensor(task_id="ledger", state="published", **ends)
    JetStreamConsumerDrainedSensor(task_id="ended_after_a_worker", stream="{{ params.stream }}", consumer="B",
                                   deferrable=True, end_from_trigger=True, poke_interval=1, timeout=600)
