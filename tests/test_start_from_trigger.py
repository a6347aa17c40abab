"""``start_from_trigger`` on the state sensors, without a server: what the DAG file hands the scheduler (through the
serialized DAG), what the triggerer renders, the refusal on Airflow 3.2 and the deferral timeout's message.
The deployment test (tests/test_airflow_deployment.py) runs such sensors through a real scheduler and triggerer."""

from __future__ import annotations

from types import SimpleNamespace

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowSensorTimeout
from airflow.serialization.serialized_objects import BaseSerialization, DagSerialization

from airflow_jetstream import airflow_compat
from airflow_jetstream.airflow_compat import AirflowVersionError
from airflow_jetstream.sensors.consumer import JetStreamConsumerDrainedSensor, JetStreamSourceCaughtUpSensor
from airflow_jetstream.sensors.kv import JetStreamKeyValueSensor
from airflow_jetstream.sensors.ledger import JetStreamBatchLedgerSensor
from airflow_jetstream.triggers.consumer import JetStreamConsumerDrainedTrigger
from airflow_jetstream.triggers.kv import JetStreamKeyValueTrigger
from airflow_jetstream.triggers.ledger import JetStreamBatchLedgerTrigger

TRIGGERS = "airflow_jetstream.triggers"


def is_ready(entry: dict, *args: object) -> bool:
    return bool(entry)


def _dag() -> DAG:
    with DAG("start_from_trigger_unit", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None) as dag:
        JetStreamConsumerDrainedSensor(task_id="drained", stream="{{ params.stream }}", consumer="c",
                                       start_from_trigger=True, poke_interval=2, timeout=600)
        JetStreamSourceCaughtUpSensor(task_id="caught_up", stream="{{ params.stream }}_COPY",
                                      source="{{ params.stream }}", start_from_trigger=True, timeout=60)
        JetStreamBatchLedgerSensor(task_id="ledger", min_batches="{{ params.batches }}", start_from_trigger=True,
                                   timeout=30)
        JetStreamKeyValueSensor(task_id="kv", bucket="{{ params.bucket }}", key="model.ready", value="{{ params.v }}",
                                start_from_trigger=True, timeout=90)
        JetStreamKeyValueSensor(task_id="kv_function", bucket="models", key="model.ready", apply_function=is_ready,
                                start_from_trigger=True)
        JetStreamConsumerDrainedSensor(task_id="from_a_worker", stream="S", consumer="c", deferrable=True)
    return dag


def _trigger_kwargs(task) -> dict:
    """The decoded task's trigger kwargs as the triggerer gets them (they stay encoded in the serialized DAG)."""
    return BaseSerialization.deserialize(task.start_trigger_args.trigger_kwargs)


def test_the_serialized_dag_hands_the_scheduler_each_trigger_with_its_templates_unrendered():
    decoded = DagSerialization.from_dict(DagSerialization.to_dict(_dag()))
    args = {task_id: decoded.get_task(task_id).start_trigger_args
            for task_id in ("drained", "caught_up", "ledger", "kv")}
    kwargs = {task_id: _trigger_kwargs(decoded.get_task(task_id)) for task_id in args}
    assert all(decoded.get_task(task_id).start_from_trigger for task_id in args)
    assert args["drained"].trigger_cls == f"{TRIGGERS}.consumer.JetStreamConsumerDrainedTrigger"
    assert kwargs["drained"] == {"stream": "{{ params.stream }}", "consumer": "c", "nats_conn_id": "nats_default",
                                 "timeout_at": None, "poll_interval": 2.0, "end_from_trigger": False}
    assert args["caught_up"].trigger_cls == f"{TRIGGERS}.consumer.JetStreamSourceCaughtUpTrigger"
    assert kwargs["caught_up"]["source"] == "{{ params.stream }}"
    assert args["ledger"].trigger_cls == f"{TRIGGERS}.ledger.JetStreamBatchLedgerTrigger"
    assert kwargs["ledger"]["run_id"] == "{{ run_id }}"
    assert kwargs["ledger"]["min_batches"] == "{{ params.batches }}"
    assert args["kv"].trigger_cls == f"{TRIGGERS}.kv.JetStreamKeyValueTrigger"
    assert kwargs["kv"]["bucket"] == "{{ params.bucket }}"
    function = _trigger_kwargs(decoded.get_task("kv_function"))["apply_function"]
    assert function == f"{__name__}.is_ready"  # by its path: Airflow refuses a callable in trigger kwargs
    # Airflow's deferral timeout is the sensor's timeout: the trigger's own deadline is not known at parse time
    assert [a.timeout.total_seconds() for a in args.values()] == [600, 60, 30, 90]
    assert {kw["timeout_at"] for kw in kwargs.values()} == {None}
    assert {a.next_method for a in args.values()} == {"execute_complete"}
    assert not decoded.get_task("from_a_worker").start_from_trigger


def test_the_triggerer_builds_each_trigger_from_its_kwargs_and_renders_the_sensors_templated_fields():
    """As Airflow 3.3's triggerer does: the trigger is built from the stored (unrendered) kwargs, given its task
    instance, then renders the sensor's template fields that are also trigger kwargs and attributes."""
    decoded = DagSerialization.from_dict(DagSerialization.to_dict(_dag()))
    context = {"params": {"stream": "ORDERS", "batches": "3", "bucket": "models", "v": "42"}, "run_id": "manual__1"}
    rendered = {}
    for task_id, cls in (("drained", JetStreamConsumerDrainedTrigger), ("ledger", JetStreamBatchLedgerTrigger),
                         ("kv", JetStreamKeyValueTrigger)):
        task = decoded.get_task(task_id)
        trigger = cls(**_trigger_kwargs(task))  # an unrendered name is not refused here
        trigger.task_instance = SimpleNamespace(task_id=task_id, task=task)
        trigger.render_template_fields(context=context)
        rendered[task_id] = trigger
    assert rendered["drained"].stream == "ORDERS"
    assert (rendered["kv"].bucket, rendered["kv"].value) == ("models", "42")
    assert set(rendered["ledger"].template_fields) == {"run_id", "state", "ledger_bucket", "min_batches",
                                                       "nats_conn_id"}
    condition = rendered["ledger"].condition
    assert (condition.run_id, condition.min_batches) == ("manual__1", 3)


def test_airflow_3_2_refuses_start_from_trigger_naming_the_release(monkeypatch):
    """Airflow 3.2's scheduler ignores ``start_from_trigger`` (its DagRun leaves that path commented out) and
    its triggerer renders no templates: refused when the DAG is parsed, not run on a worker by surprise."""
    monkeypatch.setattr(airflow_compat, "airflow_version", lambda: (3, 2, 2))
    with pytest.raises(AirflowVersionError, match=r"start_from_trigger=True\) need Airflow 3\.3\.0 or newer; "
                                                  r"Airflow 3\.2\.2 is installed") as refused:
        JetStreamConsumerDrainedSensor(task_id="t", stream="S", consumer="c", start_from_trigger=True)
    assert refused.value.reason == "airflow_too_old"
    JetStreamConsumerDrainedSensor(task_id="t", stream="S", consumer="c", deferrable=True)  # without it: as before


def test_the_deferral_timeout_fails_the_sensor_with_airflows_trigger_timeout():
    """Started from the triggerer, the wait ends at Airflow's deferral timeout: the worker resumes the task at
    ``__fail__`` and the sensor fails with Airflow's message (``soft_fail`` skips, as for any sensor)."""
    sensor = _dag().get_task("drained")
    with pytest.raises(AirflowSensorTimeout, match=r"^Trigger timeout$"):  # next_kwargs as the worker reads them
        sensor.resume_execution("__fail__", {"error": "Trigger timeout"}, context={})
