"""Sensors the scheduler defers itself (``start_from_trigger``) for tests/test_airflow_deployment.py: the stream
name is a template the triggerer renders, and no worker runs until a trigger fires. ``drained_by_a_worker`` is the
same sensor deferred the usual way (a first poke on a worker), for contrast."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_jetstream.sensors.consumer import JetStreamConsumerDrainedSensor, JetStreamSourceCaughtUpSensor

with DAG(
    dag_id="start_from_trigger_probe",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    schedule=None,
    catchup=False,
    params={"stream": "SFT"},
    tags=["test"],
):
    for name in ("A", "B"):
        JetStreamConsumerDrainedSensor(task_id=f"drained_{name.lower()}", stream="{{ params.stream }}",
                                       consumer=name, start_from_trigger=True, poke_interval=1, timeout=600)
    JetStreamConsumerDrainedSensor(task_id="drained_by_a_worker", stream="{{ params.stream }}", consumer="C",
                                   deferrable=True, poke_interval=1, timeout=600)
    JetStreamSourceCaughtUpSensor(task_id="caught_up", stream="{{ params.stream }}_COPY", source="{{ params.stream }}",
                                  start_from_trigger=True, poke_interval=1, timeout=600)
