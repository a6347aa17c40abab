"""A deferred JetStreamMessageSensor for tests/test_airflow_deployment.py: it waits in the triggerer for a message
whose body and headers hold planted secrets, so the test can grep what a viewer reads (the triggerer's event log,
the task's log) for them."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_jetstream.sensors.message import JetStreamMessageSensor

with DAG(
    dag_id="deferred_message_probe",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    schedule=None,
    catchup=False,
    tags=["test"],
):
    JetStreamMessageSensor(
        task_id="wait_for_the_planted_message",
        stream="PROBE",
        filter_subject="probe.>",
        apply_function="tests.support.message_probe.is_planted",
        start="first",
        deferrable=True,
        timeout=600,
    )
