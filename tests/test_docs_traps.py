"""The traps issue 17 found by following the docs: each one refused, or measured and documented."""

from __future__ import annotations

import pytest

from airflow_jetstream.client import StreamConfigError, StreamNotFoundError, ensure_stream, stream_info
from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator
from airflow_jetstream.sensors.consumer import JetStreamSourceCaughtUpSensor
from tests.support.nats_calls import call_on_server as run


@pytest.mark.parametrize(("first_mode", "second_mode"), [("user", "server"), ("server", "user")])
def test_second_durable_source_on_a_workqueue_origin_is_refused_naming_the_first(first_mode, second_mode, nats_conn,
                                                                                 settings):
    run(settings, ensure_stream, {"name": "ORIG", "subjects": ["orig.>"], "retention": "workqueue"})
    first = JetStreamDurableSourceOperator(task_id="a", stream="AGG", source="ORIG", mode=first_mode,
                                           consumer="AGG_SRC" if first_mode == "user" else None,
                                           deliver_subject="_SRC.AGG" if first_mode == "user" else None)
    fed = first.execute(context={})
    assert first.execute(context={})["action"] == "unchanged"  # a re-run of the same source is not "a second"
    second = JetStreamDurableSourceOperator(task_id="b", stream="AGG2", source="ORIG", mode=second_mode,
                                            consumer="AGG2_SRC" if second_mode == "user" else None,
                                            deliver_subject="_SRC.AGG2" if second_mode == "user" else None)
    with pytest.raises(StreamConfigError) as refused:
        second.execute(context={})
    assert refused.value.reason == "origin_already_sourced"
    assert fed["consumer"] in str(refused.value) and "allow_shared_origin" in str(refused.value)
    with pytest.raises(StreamNotFoundError):
        run(settings, stream_info, "AGG2")  # nothing was created for the refused source


def test_shared_workqueue_origin_with_the_opt_in_feeds_both(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIG", "subjects": ["orig.>"], "retention": "workqueue"})
    JetStreamDurableSourceOperator(task_id="a", stream="AGG", source="ORIG").execute(context={})
    shared = JetStreamDurableSourceOperator(task_id="b", stream="AGG2", source="ORIG", mode="user", consumer="AGG2_SRC",
                                            deliver_subject="_SRC.AGG2", allow_shared_origin=True)
    assert shared.execute(context={})["action"] == "created"


def test_caught_up_means_nothing_in_flight_either(nats_conn, settings):
    """Caught up = the origin's consumer has nothing pending AND nothing awaiting the aggregate's
    confirmation: at that moment a WorkQueue origin is empty and the aggregate holds everything."""
    run(settings, ensure_stream, {"name": "ORIG", "subjects": ["orig.>"], "retention": "workqueue"})
    JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIG").execute(context={})

    async def publish(conn):
        for i in range(20):
            await conn.js.publish(f"orig.{i}", b"x")

    run(settings, publish)
    sensor = JetStreamSourceCaughtUpSensor(task_id="caught_up", stream="AGG", source="ORIG", poke_interval=0.05,
                                           timeout=60, deferrable=False)
    status = sensor.execute(context={})
    origin, aggregate = (run(settings, stream_info, name)["state"]["messages"] for name in ("ORIG", "AGG"))
    assert status["caught_up"] and status["consumer_num_pending"] == 0 and status["consumer_num_ack_pending"] == 0
    assert (origin, aggregate) == (0, 20)
