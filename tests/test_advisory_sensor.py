"""JetStreamAdvisorySensor / JetStreamAdvisoryTrigger / JetStreamAdvisoryStreamOperator against a real server."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    TaskDeferred,
)

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.advisories.types import AdvisoryPredicateError
from airflow_jetstream.client.errors import StreamNotFoundError
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.operators.advisory import JetStreamAdvisoryStreamOperator
from airflow_jetstream.sensors.advisory import JetStreamAdvisorySensor
from airflow_jetstream.sensors.base import TIMEOUT_BACKSTOP
from airflow_jetstream.triggers.advisory import JetStreamAdvisoryTrigger
from tests.conftest import set_nats_connection
from tests.support.triggers import first_event_payload


def is_orders_stream(advisory: dict) -> bool:
    return advisory.get("stream", "").startswith("ORD")


@pytest.fixture
def capture(nats_conn: str) -> dict:
    return JetStreamAdvisoryStreamOperator(task_id="capture", max_age="1h").execute(context={})


def make_stream(name: str) -> None:
    JetStreamHook().run(ensure_stream, {"name": name, "subjects": [f"{name.lower()}.>"]})




def test_stream_operator_is_idempotent(nats_conn):
    first = JetStreamAdvisoryStreamOperator(task_id="capture", max_age="1h").execute(context={})
    again = JetStreamAdvisoryStreamOperator(task_id="capture", max_age="1h").execute(context={})
    changed = JetStreamAdvisoryStreamOperator(task_id="capture", max_age="2h").execute(context={})
    assert first["action"] == "created" and first["subjects"] == ["$JS.EVENT.ADVISORY.*.>"]
    assert again["action"] == "unchanged"
    assert changed["action"] == "updated" and changed["changed"] == ["max_age"]
    json.dumps(changed)


def test_poke_mode_finds_advisory_published_before_the_sensor_started(capture):
    since = datetime.now(UTC)
    make_stream("ORDERS")  # the advisory is published now, before the sensor exists
    sensor = JetStreamAdvisorySensor(task_id="wait", advisory="stream_created", advisory_stream="ORDERS",
                                     start_time=since,
                                     poke_interval=0.1, timeout=10)
    result = sensor.execute(context={})
    assert result["type"] == "io.nats.jetstream.advisory.v1.stream_action"
    assert result["stream"] == "ORDERS" and result["advisory_kind"] == "stream_created"
    json.dumps(result)


def test_since_defaults_to_the_run_data_interval_start(capture):
    make_stream("ORDERS")
    sensor = JetStreamAdvisorySensor(task_id="wait", advisory="stream_created", advisory_stream="ORDERS",
                                     poke_interval=0.1,
                                     timeout=10)
    assert sensor.execute(context={"data_interval_start": datetime.now(UTC) - timedelta(minutes=1)})["stream"] == \
        "ORDERS"
    future = {"data_interval_start": None, "logical_date": datetime.now(UTC) + timedelta(hours=1)}
    assert sensor.resolve_since(future) == future["logical_date"]
    with pytest.raises(AirflowSensorTimeout):
        JetStreamAdvisorySensor(task_id="wait", advisory="stream_created", advisory_stream="ORDERS", poke_interval=0.1,
                                timeout=0.3).execute(context=future)


def test_poke_mode_timeout_and_soft_fail(capture):
    kwargs = {"task_id": "wait", "advisory": "batch_abandoned", "advisory_stream": "ORDERS", "poke_interval": 0.1,
              "timeout": 0.3, "start_time": datetime.now(UTC)}
    with pytest.raises(AirflowSensorTimeout):
        JetStreamAdvisorySensor(**kwargs).execute(context={})
    with pytest.raises(AirflowSkipException):
        JetStreamAdvisorySensor(soft_fail=True, **kwargs).execute(context={})


def test_match_predicate_by_function_and_by_dict(capture):
    since = datetime.now(UTC)
    make_stream("INVOICES")
    make_stream("ORDERS2")
    by_function = JetStreamAdvisorySensor(task_id="w", advisory="stream_created", match=is_orders_stream,
                                          start_time=since,
                                          poke_interval=0.1, timeout=10)
    assert by_function.match == f"{__name__}.is_orders_stream"
    assert by_function.execute(context={})["stream"] == "ORDERS2"
    by_dict = JetStreamAdvisorySensor(task_id="w", advisory="stream_created", match={"stream": "INVOICES"},
                                      start_time=since, poke_interval=0.1, timeout=10)
    assert by_dict.execute(context={})["stream"] == "INVOICES"
    with pytest.raises(AdvisoryPredicateError):
        JetStreamAdvisorySensor(task_id="w", advisory="stream_created", match=lambda a: True)


def test_guard_mode_succeeds_after_quiet_period_and_fails_on_a_match(capture):
    since = datetime.now(UTC)
    quiet = JetStreamAdvisorySensor(task_id="guard", advisory="stream_deleted", start_time=since, expect="absent",
                                    quiet_period=0.3, poke_interval=0.1, timeout=10)
    result = quiet.execute(context={})
    assert result["expect"] == "absent" and result["advisory"] is None
    assert datetime.fromisoformat(result["checked_until"]) >= since
    make_stream("DOOMED")
    JetStreamHook().run(lambda conn: conn.api_request("STREAM.DELETE.DOOMED"))
    guard = JetStreamAdvisorySensor(task_id="guard", advisory="stream_deleted", start_time=since, expect="absent",
                                    quiet_period=30, poke_interval=0.1, timeout=10)
    with pytest.raises(AirflowFailException, match=r"guard failed: advisory stream_deleted .*stream=DOOMED"):
        guard.execute(context={})
    soft = JetStreamAdvisorySensor(task_id="guard", advisory="stream_deleted", start_time=since, expect="absent",
                                   quiet_period=30, poke_interval=0.1, timeout=10, soft_fail=True)
    with pytest.raises(AirflowSkipException):
        soft.execute(context={})


def test_missing_capture_stream_fails_with_the_fix(nats_conn):
    sensor = JetStreamAdvisorySensor(task_id="w", advisory="stream_created", poke_interval=0.1, timeout=1)
    with pytest.raises(StreamNotFoundError, match="JetStreamAdvisoryStreamOperator"):
        sensor.execute(context={})


def test_deferrable_defers_with_a_serializable_trigger(capture):
    since = datetime.now(UTC)
    sensor = JetStreamAdvisorySensor(task_id="wait", advisory="batch_abandoned", advisory_stream="ORDERS",
                                     reason="timeout",
                                     match=is_orders_stream, start_time=since, deferrable=True, timeout=600)
    before = datetime.now(UTC)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context={})
    after = datetime.now(UTC)
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout == timedelta(seconds=600 + TIMEOUT_BACKSTOP)  # the trigger's own comes first
    trigger = deferred.value.trigger
    # the sensor's timeout counted from its deferral (the clock read in between)
    timeout_at = datetime.fromisoformat(trigger.timeout_at)
    assert before + timedelta(seconds=600) <= timeout_at <= after + timedelta(seconds=600)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_jetstream.triggers.advisory.JetStreamAdvisoryTrigger"
    json.dumps(kwargs)
    rebuilt = JetStreamAdvisoryTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs["advisory"] == "batch_abandoned" and kwargs["start_time"] == since.isoformat()
    assert kwargs["match"] == f"{__name__}.is_orders_stream" and kwargs["nats_conn_id"] == "nats_default"


def test_timeouts_say_what_was_looked_for(capture):
    since = datetime.now(UTC)
    poking = JetStreamAdvisorySensor(task_id="w", advisory="stream_deleted", advisory_stream="NEVER", start_time=since,
                                     poke_interval=0.05, timeout=0.2)
    with pytest.raises(AirflowSensorTimeout, match=r"Last seen: scanned \d+ captured advisories since .* "
                                                   r"stream_deleted stream=NEVER: no match"):
        poking.execute(context={})
    trigger = JetStreamAdvisoryTrigger(advisory="stream_deleted", advisory_stream="NEVER", start_time=since.isoformat(),
                                       fetch_timeout=0.2, timeout_at=datetime.now(UTC).isoformat())
    event = first_event_payload(trigger)
    assert event["status"] == "timeout" and "no stream_deleted stream=NEVER in capture stream" in event["description"]
    with pytest.raises(AirflowSensorTimeout, match="Last seen: no stream_deleted stream=NEVER"):
        poking.execute_complete({}, event)


def test_capture_gap_is_said_once_and_not_for_the_run_that_created_the_stream(capture, capsys):
    before = datetime(2020, 1, 1, tzinfo=UTC)  # long before the capture stream existed
    sensor = JetStreamAdvisorySensor(task_id="w", advisory="stream_deleted", start_time=before, poke_interval=0.05,
                                     timeout=0.3)
    with pytest.raises(AirflowSensorTimeout):
        sensor.execute(context={})
    out = capsys.readouterr().out
    gaps = [line for line in out.splitlines() if "were never captured" in line]
    assert len(gaps) == 1 and "warning" in gaps[0], out
    assert out.count("Scanned 0 captured advisories") > 1  # several pokes, one warning
    this_run = SimpleNamespace(start_date=before, run_after=before)  # the run started before the stream's creation
    with pytest.raises(AirflowSensorTimeout):
        JetStreamAdvisorySensor(task_id="w", advisory="stream_deleted", start_time=before, poke_interval=0.05,
                                timeout=0.3).execute(context={"dag_run": this_run})
    out = capsys.readouterr().out
    assert "[warning" not in out and "was created by this DAG run" in out, out


def test_deferrable_returns_at_once_when_already_there(capture):
    since = datetime.now(UTC)
    make_stream("READY")
    sensor = JetStreamAdvisorySensor(task_id="wait", advisory="stream_created", advisory_stream="READY",
                                     start_time=since,
                                     deferrable=True)
    assert sensor.execute(context={})["stream"] == "READY"


def test_trigger_finds_advisory_published_while_deferred(capture):
    since = datetime.now(UTC)
    trigger = JetStreamAdvisoryTrigger(advisory="stream_created", advisory_stream="LATER", start_time=since.isoformat(),
                                       fetch_timeout=0.5)

    async def publish_later(waiting):
        await asyncio.wait({waiting}, timeout=0.3)
        assert not waiting.done()
        await asyncio.to_thread(make_stream, "LATER")

    event = first_event_payload(trigger, while_waiting=publish_later)
    assert event["status"] == "matched" and event["advisory"]["stream"] == "LATER"
    sensor = JetStreamAdvisorySensor(task_id="wait", advisory="stream_created", advisory_stream="LATER",
                                     deferrable=True)
    assert sensor.execute_complete({}, event)["stream"] == "LATER"


def test_trigger_guard_mode_quiet_and_matched(capture):
    since = datetime.now(UTC)
    quiet = JetStreamAdvisoryTrigger(advisory="stream_deleted", start_time=since.isoformat(), expect="absent",
                                     quiet_until=(datetime.now(UTC) + timedelta(seconds=0.5)).isoformat(),
                                     fetch_timeout=0.2)
    event = first_event_payload(quiet)
    assert event["status"] == "quiet"
    guard = JetStreamAdvisorySensor(task_id="g", advisory="stream_deleted", expect="absent", deferrable=True)
    assert guard.execute_complete({}, event)["advisory"] is None
    make_stream("GONE")
    JetStreamHook().run(lambda conn: conn.api_request("STREAM.DELETE.GONE"))
    # quiet_until already passed: the final scan still sees the stored advisory
    late = JetStreamAdvisoryTrigger(advisory="stream_deleted", start_time=since.isoformat(), expect="absent",
                                    quiet_until=datetime.now(UTC).isoformat(), fetch_timeout=0.2)
    matched = first_event_payload(late)
    assert matched["status"] == "matched" and matched["advisory"]["stream"] == "GONE"
    with pytest.raises(AirflowFailException, match="stream=GONE"):
        guard.execute_complete({}, matched)


def test_trigger_live_mode_without_capture_stream(nats_conn):
    trigger = JetStreamAdvisoryTrigger(advisory="stream_created", capture_stream=None)
    made = []

    async def keep_creating(waiting):
        while not waiting.done():  # the live subscription starts at some point: create until it is seen
            made.append(f"LIVE{len(made)}")
            await asyncio.to_thread(make_stream, made[-1])
            await asyncio.wait({waiting}, timeout=0.2)

    event = first_event_payload(trigger, while_waiting=keep_creating)
    assert event["status"] == "matched" and event["advisory"]["stream"] in made


def test_trigger_reports_errors_as_events(nats_conn):
    trigger = JetStreamAdvisoryTrigger(advisory="stream_created", start_time=datetime.now(UTC).isoformat())
    event = first_event_payload(trigger)
    assert event["status"] == "error" and event["error"]["reason"] == "stream_not_found"
    sensor = JetStreamAdvisorySensor(task_id="w", advisory="stream_created", deferrable=True)
    with pytest.raises(AirflowException, match="stream_not_found"):
        sensor.execute_complete({}, event)


def test_deferral_timeout_and_soft_fail_behave_like_airflow_sensors():
    from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason

    timeout = {"error": TriggerFailureReason.TRIGGER_TIMEOUT}
    strict = JetStreamAdvisorySensor(task_id="w", advisory="stream_created", deferrable=True)
    with pytest.raises(AirflowSensorTimeout):
        strict.resume_execution(TRIGGER_FAIL_REPR, timeout, {})
    soft = JetStreamAdvisorySensor(task_id="w", advisory="stream_created", deferrable=True, soft_fail=True)
    with pytest.raises(AirflowSkipException):
        soft.resume_execution(TRIGGER_FAIL_REPR, timeout, {})
    guard = JetStreamAdvisorySensor(task_id="w", advisory="stream_deleted", expect="absent", soft_fail=True)
    with pytest.raises(AirflowSkipException):
        guard.resume_execution("execute_complete", {"event": {"status": "matched", "advisory": {"stream": "X"}}}, {})


def test_bad_parameters_fail_at_parse_time():
    with pytest.raises(ValueError, match="expect"):
        JetStreamAdvisorySensor(task_id="w", advisory="stream_created", expect="maybe")
    with pytest.raises(ValueError, match="quiet_until"):
        JetStreamAdvisoryTrigger(advisory="stream_created", expect="absent")


def test_sensor_uses_its_connection_id(monkeypatch, nats_server):
    set_nats_connection(monkeypatch, "nats_other", nats_server.url)
    JetStreamAdvisoryStreamOperator(task_id="capture", nats_conn_id="nats_other").execute(context={})
    since = datetime.now(UTC)

    async def create():
        settings = ConnectionSettings(servers=nats_server.url)
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "VIA_OTHER", "subjects": ["via.>"]})

    asyncio.run(create())
    sensor = JetStreamAdvisorySensor(task_id="w", advisory="stream_created", advisory_stream="VIA_OTHER",
                                     start_time=since,
                                     nats_conn_id="nats_other", poke_interval=0.1, timeout=5)
    assert sensor.execute(context={})["stream"] == "VIA_OTHER"


def test_trigger_retries_an_unreachable_server_then_reports(monkeypatch):
    from airflow_jetstream.embedded.server import free_port
    from airflow_jetstream.triggers import base as trigger_base

    monkeypatch.setattr(trigger_base, "TRANSIENT_RETRIES", 1)
    set_nats_connection(monkeypatch, "nats_default", f"nats://127.0.0.1:{free_port()}", extra={"connect_timeout": 0.3})
    trigger = JetStreamAdvisoryTrigger(advisory="stream_created", start_time=datetime.now(UTC).isoformat())
    event = first_event_payload(trigger)
    assert event["status"] == "error" and event["error"]["reason"] == "server_unreachable"


def test_trigger_does_not_retry_refused_credentials(monkeypatch, user_server):
    from airflow_jetstream.triggers import base as trigger_base

    monkeypatch.setattr(trigger_base, "TRANSIENT_RETRIES", 50)  # would take minutes if it retried
    set_nats_connection(monkeypatch, "nats_default", user_server.url, login="airflow", password="wrong")
    trigger = JetStreamAdvisoryTrigger(advisory="stream_created", start_time=datetime.now(UTC).isoformat())
    event = first_event_payload(trigger, timeout=15)
    assert event["status"] == "error" and event["error"]["reason"] == "authentication_failed"
    assert "wrong" not in json.dumps(event)


def test_bad_filter_fails_when_the_dag_is_parsed_unless_templated():
    from airflow_jetstream.client.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as err:
        JetStreamAdvisorySensor(task_id="w", advisory="batch_abandonned")
    assert err.value.reason == "unknown_advisory"
    templated = JetStreamAdvisorySensor(task_id="w", advisory="{{ params.kind }}")
    assert templated.advisory == "{{ params.kind }}"


class FakeRescheduledTI:
    """The one TaskInstance call a sensor makes in reschedule mode."""

    def __init__(self, first_try: datetime | None) -> None:
        self.first_try = first_try

    def get_first_reschedule_date(self, context) -> datetime | None:
        return self.first_try


def test_reschedule_mode_reschedules_and_counts_the_quiet_period_from_the_first_try(capture):
    from airflow.sdk.exceptions import AirflowRescheduleException

    since = datetime.now(UTC)
    waiting = JetStreamAdvisorySensor(task_id="w", advisory="stream_created", advisory_stream="NOT_YET",
                                      start_time=since,
                                      mode="reschedule", poke_interval=5, timeout=60)
    with pytest.raises(AirflowRescheduleException):
        waiting.execute(context={"ti": FakeRescheduledTI(None)})
    guard = {"task_id": "g", "advisory": "stream_deleted", "start_time": since, "expect": "absent", "quiet_period": 30,
             "mode": "reschedule", "poke_interval": 5, "timeout": 600}
    with pytest.raises(AirflowRescheduleException):  # first try just started: the quiet period is not over
        JetStreamAdvisorySensor(**guard).execute(context={"ti": FakeRescheduledTI(None)})
    first_try = datetime.now(UTC) - timedelta(seconds=31)  # a later try: quiet since the first one
    result = JetStreamAdvisorySensor(**guard).execute(context={"ti": FakeRescheduledTI(first_try)})
    assert result["expect"] == "absent" and result["advisory"] is None
