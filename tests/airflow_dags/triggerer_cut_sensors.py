"""Deferred sensors for the multi-host tier's triggerer cut (tests/test_hosts_deployment.py): each run of
``triggerer_cut_sensors`` is 50 KV key sensors that the scheduler defers itself (``start_from_trigger``) and whose
triggers end the task (``end_from_trigger``), so no worker runs for them: 20 runs are 1,000 waiting sensors, and
one write of the key ends them all.

50 sensors per run rather than 1,000 in one run: the triggerer sends each trigger of a ``start_from_trigger`` task
the whole serialized DAG (about 1 KB a task) and builds the DAG again from it, so 1,000 tasks in one DAG would cost
1 GB of messages between the triggerer's processes."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_jetstream.sensors.kv import JetStreamKeyValueSensor

BUCKET = "triggerer_cut"
SENSORS_PER_RUN = 50

with DAG(
    dag_id="triggerer_cut_sensors",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    schedule=None,
    catchup=False,
    max_active_runs=40,  # the test's 20 runs wait at once (default 16)
    params={"key": "go"},
    tags=["test"],
):
    for number in range(SENSORS_PER_RUN):
        JetStreamKeyValueSensor(task_id=f"wait_{number:02d}", bucket=BUCKET, key="{{ params.key }}",
                                start_from_trigger=True, end_from_trigger=True, timeout=1800)
