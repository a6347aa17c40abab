"""Frozen stored and serialized forms: what a release writes, the next one must read (the rule: CHANGELOG.md).

Airflow keeps a deferred task's trigger as its ``serialize()`` output and rebuilds it in the (maybe upgraded)
triggerer; it keeps trigger events, XCom results and connection extras in its database; the batch ledger,
its counts and the job records live in KV buckets that outlive any release. ``tests/golden/`` holds one of
each, written by this module's scenario on a real nats-server. The suite fails when

- today's code cannot read a golden form: a trigger is re-created from its golden ``serialize()`` output and
  serializes the same; ledger records, counts and job records are decoded (the job record through the KV read
  the streaming sink uses); each sensor's ``execute_complete`` takes its golden event; the hook builds settings
  from the golden connection; or
- today's code writes a form of another shape (keys and JSON types, not values: sequences and times differ).

A deliberate change regenerates the files with one command, and its commit says how an upgrade reads the old
form (a test that reads the previous golden file, kept beside the new one)::

    GOLDEN_WRITE=1 .venv/bin/python -m pytest -p no:xdist tests/test_golden.py
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.kv.job_records import DEFAULT_JOB_BUCKET, get_job_record
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.counts import decode_counts
from airflow_jetstream.client.ledger.records import DEFAULT_BUCKET, BatchRecord, batch_key, counts_key, shard_of
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.settings import CONNECTION_FIELDS, ConnectionSettings
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.message_events import asset_messages
from airflow_jetstream.operators.advisory import JetStreamAdvisoryStreamOperator
from airflow_jetstream.operators.consume import JetStreamConsumeOperator
from airflow_jetstream.operators.consumer import JetStreamConsumerResetOperator
from airflow_jetstream.operators.kv import JetStreamKeyValueOperator
from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator
from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator
from airflow_jetstream.sensors.advisory import JetStreamAdvisorySensor
from airflow_jetstream.sensors.consumer import JetStreamConsumerDrainedSensor, JetStreamSourceCaughtUpSensor
from airflow_jetstream.sensors.kv import JetStreamKeyValueSensor
from airflow_jetstream.sensors.ledger import JetStreamBatchLedgerSensor
from airflow_jetstream.sensors.message import JetStreamMessageSensor
from airflow_jetstream.triggers.message import JetStreamMessageTrigger
from tests.conftest import set_nats_connection

GOLDEN = Path(__file__).resolve().parent / "golden"
WRITE = os.environ.get("GOLDEN_WRITE") == "1"
RUN = "golden_run"
#: Connection fields holding a path: the golden connection names placeholder files, replaced by real ones here.
PATH_FIELDS = ("creds_file", "tls_ca_file", "tls_cert_file", "tls_key_file")
#: The waits (a sensor's trigger, and the event-driven DAGs' message trigger) with a golden trigger and event.
WAITS = ("kv", "ledger", "drained", "caught_up", "message", "advisory", "event_driven")


def is_ready(message: Any) -> bool:
    """The golden sensor's and consume operator's function (importable, as a deferred trigger needs)."""
    body = message.get("json") if isinstance(message, dict) else json.loads(message.data)
    return bool(body.get("ready"))


def _sensors() -> dict[str, Any]:
    """One sensor per trigger class, each with a condition the scenario makes true."""
    return {
        "kv": JetStreamKeyValueSensor(task_id="kv", bucket="GOLD_KV", key="model", value="ready"),
        "ledger": JetStreamBatchLedgerSensor(task_id="ledger", run_id=RUN, state="published"),
        "drained": JetStreamConsumerDrainedSensor(task_id="drained", stream="GOLD", consumer="READER"),
        "caught_up": JetStreamSourceCaughtUpSensor(task_id="caught_up", stream="GOLD_AGG", source="GOLD"),
        "message": JetStreamMessageSensor(task_id="message", stream="GOLD", start="first",
                                          apply_function="tests.test_golden.is_ready"),
        "advisory": JetStreamAdvisorySensor(task_id="advisory", advisory="stream_created", advisory_stream="GOLD",
                                            start_time="2020-01-01T00:00:00+00:00"),
    }


def _ending_trigger() -> Any:
    """A trigger that ends its task itself (``end_from_trigger=True``; its events are the drained sensor's)."""
    sensor = JetStreamConsumerDrainedSensor(task_id="ends", stream="GOLD", consumer="READER", end_from_trigger=True)
    return sensor.make_trigger({})


def _message_trigger() -> JetStreamMessageTrigger:
    return JetStreamMessageTrigger(stream="GOLD", consumer="GOLD_EVENTS", fetch_timeout=0.5)


async def _event_driven_payload(conn: JetStreamConnection) -> dict[str, Any]:
    """What an asset event of an event-driven DAG carries of a message (its ``extra["payload"]``)."""
    sub = await conn.js.pull_subscribe("gold.orders", durable="GOLD_EVENTS", stream="GOLD")
    (msg,) = await sub.fetch(1, timeout=5)
    await msg.ack()
    event = _message_trigger().event_for(Message.from_delivery(msg))
    assert event is not None
    return {"payload": event.payload}


def _xcom_results() -> dict[str, Any]:
    """Each operator's XCom result, run in the order a pipeline would."""
    results = {"advisory_stream": JetStreamAdvisoryStreamOperator(task_id="capture", max_age="1h").execute({})}
    results["ensure_stream"] = JetStreamEnsureStreamOperator(  # after the capture stream: its advisory is stored
        task_id="ensure", config={"name": "GOLD", "subjects": ["gold.>"], "allow_atomic": True}).execute({})
    results["publish"] = JetStreamAtomicBatchPublishOperator(
        task_id="publish", stream="GOLD", subject="gold.orders",
        messages=[{"data": {"order": 1, "ready": True}}, {"data": {"order": 2}}]).execute({})
    results["durable_source"] = JetStreamDurableSourceOperator(
        task_id="source", stream="GOLD_AGG", source="GOLD", user_managed=True).execute({})
    results["consume"] = JetStreamConsumeOperator(task_id="consume", stream="GOLD", consumer="READER",
                                                  apply_function="tests.test_golden.is_ready").execute({})
    results["consumer_reset"] = JetStreamConsumerResetOperator(
        task_id="reset", stream="GOLD", consumer="READER", start_seq=3).execute({})
    results["kv"] = JetStreamKeyValueOperator(task_id="kv", bucket="GOLD_KV", key="model", value="ready",
                                              bucket_config={}).execute({})
    return results


async def _stored(conn: JetStreamConnection) -> dict[str, Any]:
    """A batch recorded in the ledger (as the Spark writer records each chunk), its record and counts, and the job
    record of the Spark write, as stored (JSON)."""
    ledger = await BatchLedger.open(conn)
    await ledger.record(RUN, "b1", stream="GOLD", count=2, first_seq=1, last_seq=2)
    kv = await conn.js.key_value(DEFAULT_BUCKET)
    record = (await kv.get(batch_key(RUN, "b1"))).value
    counts = (await kv.get(counts_key(RUN, shard_of("b1")))).value
    job = (await (await conn.js.key_value(DEFAULT_JOB_BUCKET)).get("golden-job")).value
    return {"batch_record": json.loads(record), "counts": json.loads(counts), "job_record": json.loads(job)}


def _write_job_record(url: str) -> None:
    """A job record as the Spark writer's driver writes it on commit (one partition reported)."""
    from pyspark.sql.types import StringType, StructField, StructType

    from airflow_jetstream.spark.options import WriteOptions
    from airflow_jetstream.spark.writer import JetStreamWriter, PartitionReport

    options = WriteOptions.parse({"servers": url, "stream": "GOLD", "subject": "gold.spark", "job_id": "golden-job"})
    writer = JetStreamWriter(options, StructType([StructField("value", StringType())]))
    writer.commit([PartitionReport(partition=0, attempt=0, job_id="golden-job", rows=2, batches=1, stored=2,
                                   ranges=[[3, 4]], seconds=0.1)])


def _connection_extras() -> dict[str, Any]:
    """A ``nats`` connection's extras with every field, as Airflow stores them."""
    values = {str: "golden", bool: False, float: 7.5}
    extras = {name: values[spec.kind] for name, spec in CONNECTION_FIELDS.items()}
    extras.update({name: f"/etc/nats/{name}" for name in PATH_FIELDS}, token=None, api_prefix=None)
    return {"conn_type": "nats", "host": "nats-1:4222,nats-2:4222", "login": "app", "password": "secret",
            "extra": {k: v for k, v in extras.items() if v is not None}}


def shape(value: Any) -> Any:
    """The JSON shape: keys and types, a list by the distinct shapes of its items (numbers are one type)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        shapes: list[Any] = []
        for item in map(shape, value):
            if item not in shapes:
                shapes.append(item)
        return shapes
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return type(value).__name__
    return "number"


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


@pytest.fixture(scope="module")
def fresh(nats_server_module) -> dict[str, Any]:
    """Every form, written now by today's code on a real server."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        set_nats_connection(monkeypatch, "nats_default", nats_server_module.url)
        forms: dict[str, Any] = {"xcom": _xcom_results()}
        _write_job_record(nats_server_module.url)
        forms["ledger"] = JetStreamHook().run(_stored)
        sensors = _sensors()
        triggers = {name: sensor.make_trigger({"run_id": RUN}) for name, sensor in sensors.items()}
        forms["events"] = {name: JetStreamHook().run(trigger.check) for name, trigger in triggers.items()}
        triggers["event_driven"] = _message_trigger()
        triggers["ends_task"] = _ending_trigger()
        forms["events"]["event_driven"] = JetStreamHook().run(_event_driven_payload)
        forms["triggers"] = {name: list(trigger.serialize()) for name, trigger in triggers.items()}
        forms["connection"] = _connection_extras()
        yield _plain(forms)
    finally:
        monkeypatch.undo()


@pytest.fixture(scope="module")
def nats_server_module(tmp_path_factory) -> Iterator[Any]:
    from airflow_jetstream.embedded import EmbeddedNatsServer

    with EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("golden")) as server:
        yield server


def _golden(name: str, folder: Path = GOLDEN) -> Any:
    return json.loads((folder / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["triggers", "events", "xcom", "ledger", "connection"])
def test_today_writes_the_golden_shapes(fresh: dict[str, Any], name: str) -> None:
    if WRITE:
        GOLDEN.mkdir(exist_ok=True)
        (GOLDEN / f"{name}.json").write_text(json.dumps(fresh[name], indent=2, sort_keys=True) + "\n")
    golden = _golden(name)
    assert sorted(fresh[name]) == sorted(golden), f"{name}: forms added or removed (regenerate: see the docstring)"
    for key in golden:
        assert shape(fresh[name][key]) == shape(golden[key]), f"{name}/{key} changed shape (see the docstring)"


@pytest.mark.parametrize("name", [*WAITS, "ends_task"])
def test_a_trigger_is_recreated_from_its_golden_serialized_form(name: str) -> None:
    classpath, kwargs = _golden("triggers")[name]
    module, cls_name = classpath.rsplit(".", 1)
    trigger = getattr(importlib.import_module(module), cls_name)(**kwargs)
    assert _plain(list(trigger.serialize())) == [classpath, kwargs]


@pytest.mark.parametrize("name", WAITS)
def test_each_sensor_reads_its_golden_event(fresh: dict[str, Any], name: str) -> None:
    """Today's events of the message sensor and trigger say where the message is: read back from the scenario's
    stream (``fresh`` keeps it and ``nats_default``)."""
    event = _golden("events")[name]
    if name == "event_driven":  # an asset event's extra: what asset_messages reads in users' DAGs
        stored = SimpleNamespace(extra=event, timestamp=datetime(2026, 1, 1, tzinfo=UTC))
        (read,) = asset_messages("asset", {"asset": [stored]})
        assert read["json"] == {"order": 1, "ready": True} and read["stream_seq"] == event["payload"]["stream_seq"]
        return
    result = _sensors()[name].execute_complete({"run_id": RUN}, event)
    assert result is not None


#: The forms 0.1.0 development wrote before trigger events stopped carrying message bodies (body_in_event).
PREVIOUS = GOLDEN / "previous"
#: The triggers serialized before the state and KV triggers took ``end_from_trigger``.
BEFORE_END_FROM_TRIGGER = GOLDEN / "before_end_from_trigger"
#: What a trigger serialized in each earlier form gains when re-created today (the defaults of arguments added since).
ADDED_SINCE = {
    PREVIOUS: {"message": {"body_in_event": False}, "event_driven": {"body_in_event": False}},
    BEFORE_END_FROM_TRIGGER: {},
}
ENDS_TASKS = ("kv", "ledger", "drained", "caught_up")


@pytest.mark.parametrize("folder", list(ADDED_SINCE), ids=lambda folder: folder.name)
@pytest.mark.parametrize("name", WAITS)
def test_a_trigger_serialized_in_an_earlier_form_is_recreated_with_the_defaults_of_what_it_lacks(
        name: str, folder: Path) -> None:
    classpath, kwargs = _golden("triggers", folder)[name]
    module, cls_name = classpath.rsplit(".", 1)
    trigger = getattr(importlib.import_module(module), cls_name)(**kwargs)
    added = {**ADDED_SINCE[folder].get(name, {}), **({"end_from_trigger": False} if name in ENDS_TASKS else {})}
    assert _plain(list(trigger.serialize())) == [classpath, {**kwargs, **added}]
    if name in ENDS_TASKS:  # it waits as before: its success is the plain event a worker's execute_complete takes
        assert trigger.end_from_trigger is False


@pytest.mark.parametrize("name", ["message", "event_driven"])
def test_an_event_with_the_body_from_before_is_used_as_it_is(name: str) -> None:
    """Events stored before (the body in them) need no server: nothing is read back."""
    event = _golden("events", PREVIOUS)[name]
    if name == "event_driven":
        stored = SimpleNamespace(extra=event, timestamp=datetime(2026, 1, 1, tzinfo=UTC))
        assert asset_messages("asset", {"asset": [stored]}) == [event["payload"]]
        return
    assert _sensors()[name].execute_complete({"run_id": RUN}, event) == event["message"]


def test_ledger_records_counts_and_job_records_are_read_from_their_golden_form(monkeypatch, nats_server) -> None:
    ledger = _golden("ledger")
    record = BatchRecord.decode(json.dumps(ledger["batch_record"]).encode(), revision=1)
    assert (record.run_id, record.state) == (RUN, "published")
    counts = decode_counts(json.dumps(ledger["counts"]).encode(), "golden_run.counts.0", 1)
    assert counts["run_id"] == RUN

    async def job_record() -> dict[str, Any] | None:
        settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=5)
        async with open_connection(settings) as conn:
            jobs = await conn.js.create_key_value(bucket=DEFAULT_JOB_BUCKET)
            await jobs.put("golden-job", json.dumps(ledger["job_record"]).encode())
            return await get_job_record(conn, "golden-job")

    assert asyncio.run(job_record()) == ledger["job_record"]


def test_the_hook_reads_the_golden_connection(monkeypatch, tmp_path) -> None:
    connection = _golden("connection")
    for name in PATH_FIELDS:
        path = tmp_path / name
        path.write_text("-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n"
                        "-----BEGIN USER NKEY SEED-----\nSUx\n------END USER NKEY SEED------\n")
        connection["extra"][name] = str(path)
    monkeypatch.setenv("AIRFLOW_CONN_NATS_GOLDEN", json.dumps(connection))
    settings = JetStreamHook("nats_golden").get_settings()
    assert settings.user == "app" and len(settings.servers) == 2
    assert {name for name in connection["extra"] if getattr(settings, name) in (None, "")} == set()
