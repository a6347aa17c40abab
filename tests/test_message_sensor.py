"""JetStreamMessageSensor (poke and deferrable) and JetStreamAwaitMessageTrigger on a real server."""

from __future__ import annotations

import asyncio
import functools
import json
from datetime import UTC, datetime

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.connection_pool import POOL
from airflow_jetstream.client.errors import InvalidFunctionError, JetStreamError
from airflow_jetstream.client.reading.read_plan import find_message
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.sensors.message import JetStreamMessageSensor
from airflow_jetstream.triggers.await_message import JetStreamAwaitMessageTrigger
from tests.support.catch_up_gate import held_at_the_gate
from tests.support.polling import async_wait_until
from tests.support.servers import default_conn_id, module_server


def is_order(message, order_id: int) -> bool | dict:
    """Module-level predicate: the order with this id; returns a small dict (pushed as ``result``)."""
    body = message.json()
    return {"total": body["total"]} if body.get("order") == int(order_id) else False


def explode(message) -> bool:
    raise KeyError("order")


server = module_server("await")
conn_id = default_conn_id()


def _settings(server: EmbeddedNatsServer) -> ConnectionSettings:
    return ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=3)


async def _publish(server: EmbeddedNatsServer, stream: str, orders: list[int], **config) -> None:
    async with open_connection(_settings(server)) as conn:
        await ensure_stream(conn, {"name": stream, "subjects": [f"{stream.lower()}.>"], **config})
        for order in orders:
            body = json.dumps({"order": order, "total": order * 10}).encode()
            await conn.js.publish(f"{stream.lower()}.created", body, headers={"Order-Id": str(order)})


def _sensor(stream: str, **kwargs) -> JetStreamMessageSensor:
    kwargs.setdefault("apply_function", "tests.test_message_sensor.is_order")
    return JetStreamMessageSensor(task_id="await", stream=stream, filter_subject=f"{stream.lower()}.created",
                                  timeout=30, **kwargs)


def test_poke_from_the_first_message_pushes_the_match(conn_id, server) -> None:
    asyncio.run(_publish(server, "AWAIT_POKE", [1, 2, 3, 4]))
    sensor = _sensor("AWAIT_POKE", apply_function=is_order, apply_function_kwargs={"order_id": 3}, start="first",
                     deferrable=False)
    done = sensor.poke({})
    assert done.is_done
    message = done.xcom_value
    assert (message["seq"], message["subject"], message["headers"], message["result"]) == \
        (3, "await_poke.created", {"Order-Id": "3"}, {"total": 30})
    assert json.loads(message["data"]) == {"order": 3, "total": 30}
    json.dumps(message)


def test_new_start_skips_stored_messages_and_resumes_between_pokes(conn_id, server) -> None:
    asyncio.run(_publish(server, "AWAIT_NEW", [7, 8]))
    sensor = _sensor("AWAIT_NEW", apply_function_kwargs={"order_id": 7}, deferrable=False)
    assert not sensor.poke({}).is_done  # order 7 is stored already: not new
    asyncio.run(_publish(server, "AWAIT_NEW", [9, 7]))
    done = sensor.poke({})
    assert done.is_done and done.xcom_value["seq"] == 4


def test_start_at_a_time(conn_id, server) -> None:
    asyncio.run(_publish(server, "AWAIT_TIME", [5]))
    since = datetime.now(UTC).isoformat()
    asyncio.run(_publish(server, "AWAIT_TIME", [6, 5]))
    sensor = _sensor("AWAIT_TIME", apply_function_kwargs={"order_id": 5}, start=since, deferrable=False)
    done = sensor.poke({})
    assert done.is_done and done.xcom_value["seq"] == 3


def test_deferrable_sensor_defers_and_the_trigger_fires_on_a_new_match(conn_id, server) -> None:
    asyncio.run(_publish(server, "AWAIT_DEFER", [1]))
    sensor = _sensor("AWAIT_DEFER", apply_function_kwargs={"order_id": 2}, start="first", deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, JetStreamAwaitMessageTrigger) and trigger.start_seq == 2  # after what the poke saw
    _, kwargs = trigger.serialize()
    trigger = JetStreamAwaitMessageTrigger(**kwargs)
    settings = JetStreamHook(nats_conn_id=conn_id).get_settings()

    async def scenario() -> list[dict]:
        second = JetStreamAwaitMessageTrigger(**{**kwargs, "apply_function_kwargs": {"order_id": 3}})
        runs = [asyncio.ensure_future(anext(t.run())) for t in (trigger, second)]
        await async_wait_until(lambda: POOL.users(settings) == 2, "both triggers waiting on the server")
        shared = POOL.open_connections()
        await _publish(server, "AWAIT_DEFER", [3, 2])
        events = [(await asyncio.wait_for(run, 20)).payload for run in runs]
        return [{"shared": shared}, *events]

    info, first_event, second_event = asyncio.run(scenario())
    assert info["shared"] == 1, "two triggers of one connection id share one NATS connection"
    assert (first_event["status"], first_event["message"]["seq"]) == ("matched", 3)
    assert second_event["message"]["seq"] == 2
    assert first_event["message"] == {"stream": "AWAIT_DEFER", "subject": "await_defer.created", "seq": 3,
                                      "time": first_event["message"]["time"], "delivered": 1}, \
        "the event (in the triggerer's log) says where the message is, not what it says"
    completed = sensor.execute_complete({}, first_event)
    assert completed["result"] == {"total": 20} and json.loads(completed["data"]) == {"order": 2, "total": 20}
    assert completed["headers"] == {"Order-Id": "2"}, "read back by the task: the XCom keeps its form"
    with pytest.raises(AirflowException, match="apply_function_failed"):
        sensor.execute_complete({}, {"status": "error", "error": {"message": "x", "reason": "apply_function_failed"}})


def test_a_failing_function_is_a_typed_error_event(conn_id, server) -> None:
    asyncio.run(_publish(server, "AWAIT_FAIL", [1]))
    trigger = JetStreamAwaitMessageTrigger(stream="AWAIT_FAIL", apply_function="tests.test_message_sensor.explode",
                                           start_seq=1, nats_conn_id=conn_id)
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 20)).payload
    assert event["status"] == "error" and event["error"]["reason"] == "apply_function_failed"
    assert "seq 1" in event["error"]["message"]


def test_a_following_look_reads_what_is_stored_only_when_its_turn_to_catch_up_comes(conn_id, server) -> None:
    """Following the stream, a trigger reads what was stored before it joined the stream's shared tail inside
    ``listener.catching_up()``: a thousand deferred sensors starting together read their backlog CATCH_UP_AT_ONCE
    at a time. A match already stored fires only once a turn is free."""
    asyncio.run(_publish(server, "AWAIT_GATE", [1, 2, 3]))

    async def scenario() -> tuple[bool, dict]:
        async with open_connection(_settings(server)) as conn:
            look = find_message(conn, "AWAIT_GATE", functools.partial(is_order, order_id=2), follow=True)
            return await held_at_the_gate(conn, "AWAIT_GATE", look)

    fired_while_held, found = asyncio.run(scenario())
    assert not fired_while_held
    assert (found["message"]["seq"], found["message"]["result"], found["next_seq"]) == (2, {"total": 20}, 3)


@pytest.mark.parametrize("allow_direct", [True, False], ids=["direct_get", "message_get"])
def test_workqueue_streams_are_read_without_a_consumer_or_taking_messages(conn_id, server, allow_direct) -> None:
    stream = f"AWAIT_WQ_{int(allow_direct)}"
    asyncio.run(_publish(server, stream, [1, 2], retention="workqueue", allow_direct=allow_direct))
    done = _sensor(stream, apply_function_kwargs={"order_id": 2}, start="first", deferrable=False).poke({})
    assert done.is_done and done.xcom_value["seq"] == 2

    async def messages() -> tuple[int, int]:
        async with open_connection(_settings(server)) as conn:
            state = (await stream_info(conn, stream))["state"]
            return state["messages"], state["consumer_count"]
    assert asyncio.run(messages()) == (2, 0)


def test_bad_input_is_a_typed_error_naming_the_fix(conn_id, server) -> None:
    with pytest.raises(InvalidFunctionError, match="module-level function"):
        _sensor("AWAIT_BAD", apply_function=lambda m: True, deferrable=True)
    with pytest.raises(InvalidFunctionError, match="cannot import"):
        _sensor("AWAIT_BAD", apply_function="nowhere.func", deferrable=False)
    asyncio.run(_publish(server, "AWAIT_WQ2", [1], retention="workqueue"))
    with pytest.raises(Exception, match="'new', 'first'") as bad_start:
        _sensor("AWAIT_WQ2", apply_function_kwargs={"order_id": 1}, start="yesterday", deferrable=False).poke({})
    assert bad_start.value.reason == "invalid_start"


def test_the_body_is_in_the_event_only_when_asked_and_a_message_gone_is_a_typed_error(conn_id, server) -> None:
    asyncio.run(_publish(server, "AWAIT_OPT", [1, 2]))
    kwargs = {"stream": "AWAIT_OPT", "apply_function": "tests.test_message_sensor.is_order", "start_seq": 1,
              "apply_function_kwargs": {"order_id": 2}}
    opted_in = JetStreamHook(nats_conn_id=conn_id).run(
        JetStreamAwaitMessageTrigger(**kwargs, body_in_event=True).check)
    assert json.loads(opted_in["message"]["data"]) == {"order": 2, "total": 20} and opted_in["message"]["result"]

    reference = JetStreamHook(nats_conn_id=conn_id).run(JetStreamAwaitMessageTrigger(**kwargs).check)
    assert set(reference["message"]) == {"stream", "subject", "seq", "time", "delivered"}
    asyncio.run(_purge(server, "AWAIT_OPT"))  # e.g. max_age removed it before the task ran
    sensor = _sensor("AWAIT_OPT", apply_function_kwargs={"order_id": 2}, deferrable=True)
    with pytest.raises(JetStreamError, match="body_in_event=True") as gone:
        sensor.execute_complete({}, reference)
    assert gone.value.reason == "message_gone"


async def _purge(server: EmbeddedNatsServer, stream: str) -> None:
    async with open_connection(_settings(server)) as conn:
        await conn.api_request(f"STREAM.PURGE.{stream}", {}, context="test")
