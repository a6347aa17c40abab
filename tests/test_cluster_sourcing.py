"""Durable sourcing and consumer reset on the 3-node cluster: replicas/placement of the aggregate,
20k messages sourced WorkQueue -> aggregate in both modes through a SIGKILL of the aggregate's
leader, and a reset of an R3 consumer while its leader is being elected."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace

import pytest

from airflow_jetstream.client.admin.consumers import delete_consumer, ensure_consumer, reset_consumer
from airflow_jetstream.client.admin.streams import ensure_stream, find_stream, stream_info
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import ConsumerNotFoundError, PlacementError
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.embedded import EmbeddedNatsCluster
from airflow_jetstream.operators.consumer import JetStreamConsumerResetOperator
from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator
from airflow_jetstream.sensors.consumer import JetStreamSourceCaughtUpSensor
from airflow_jetstream.triggers.consumer import JetStreamSourceCaughtUpTrigger
from tests.conftest import set_nats_cluster_connection
from tests.support.cluster_tools import call, cluster_settings, move_leader_off, publish_numbered, wait_for
from tests.support.triggers import first_event_payload

HALF = 10_000


@pytest.fixture
def cluster_conn(monkeypatch: pytest.MonkeyPatch, nats_cluster_module: EmbeddedNatsCluster) -> EmbeddedNatsCluster:
    set_nats_cluster_connection(monkeypatch, "nats_default", nats_cluster_module)
    return nats_cluster_module


def workqueue(name: str, subject: str) -> dict:
    return {"name": name, "subjects": [subject], "retention": "workqueue", "num_replicas": 3}


def replicas(cluster: EmbeddedNatsCluster, stream: str) -> int:
    return call(cluster, stream_info, stream)["config"]["num_replicas"]


def test_aggregate_gets_cluster_replicas_and_a_rerun_keeps_them(cluster_conn: EmbeddedNatsCluster) -> None:
    cluster = cluster_conn
    call(cluster, ensure_stream, workqueue("REPL_ORIG", "repl.>"))
    op = JetStreamDurableSourceOperator(task_id="agg", stream="REPL_AGG", source="REPL_ORIG")
    first = op.execute(context={})
    assert first["action"] == "created" and first["num_replicas"] == 3  # the cluster default, unasked
    again = op.execute(context={})
    assert again["action"] == "unchanged" and replicas(cluster, "REPL_AGG") == 3

    down = JetStreamDurableSourceOperator(task_id="agg", stream="REPL_AGG", source="REPL_ORIG", num_replicas=1)
    assert down.execute(context={})["action"] == "updated" and replicas(cluster, "REPL_AGG") == 1
    assert op.execute(context={})["action"] == "unchanged" and replicas(cluster, "REPL_AGG") == 1  # unset: kept


def test_impossible_placement_is_a_typed_error_and_creates_nothing(cluster_conn: EmbeddedNatsCluster) -> None:
    cluster = cluster_conn
    call(cluster, ensure_stream, workqueue("PLACE_ORIG", "place.>"))
    for options, fix in (({"num_replicas": 5}, "num_replicas"), ({"placement": {"cluster": "elsewhere"}}, "placement")):
        op = JetStreamDurableSourceOperator(task_id="agg", stream="PLACE_AGG", source="PLACE_ORIG", **options)
        with pytest.raises(PlacementError) as err:
            op.execute(context={})
        assert err.value.reason == "placement_failed" and err.value.err_code == 10005 and fix in str(err.value)
    assert call(cluster, find_stream, "PLACE_AGG") is None


def read_numbers(cluster: EmbeddedNatsCluster, stream: str) -> Counter[int]:
    async def main() -> Counter[int]:
        async with open_connection(cluster_settings(cluster)) as conn:
            last = int((await stream_info(conn, stream))["state"]["last_seq"])
            seen: Counter[int] = Counter()
            async for chunk in read_range(conn, stream, 1, last):
                seen.update(int(data) for _, _, _, _, data in chunk)
            return seen

    return asyncio.run(main())


def test_20k_sourced_in_both_modes_through_a_leader_kill(cluster_conn: EmbeddedNatsCluster) -> None:
    cluster = cluster_conn
    modes = {"server": ("WQS", "wqs.x", "AGGS"), "user": ("WQU", "wqu.x", "AGGU")}
    for mode, (origin, subject, agg) in modes.items():
        call(cluster, ensure_stream, workqueue(origin, subject))
        call(cluster, publish_numbered, subject, 1, HALF)
        result = JetStreamDurableSourceOperator(task_id=f"src_{mode}", stream=agg, source=origin, num_replicas=3,
                                                user_managed=mode == "user").execute(context={})
        assert result["num_replicas"] == 3 and result["mode"] == mode
    victim = wait_for(lambda: cluster.stream_leader("AGGS"), "a leader of AGGS")
    for origin, _, _ in modes.values():
        move_leader_off(cluster, origin, victim)  # the publisher keeps its origins; sourcing loses its leader

    cluster.kill(victim)  # mid-run: the first half is still flowing, the second is not even published
    for _, subject, _ in modes.values():
        call(cluster, publish_numbered, subject, HALF + 1, 2 * HALF)
    cluster.restart(victim)

    for mode, (origin, _, agg) in modes.items():
        sensor = JetStreamSourceCaughtUpSensor(task_id=f"caught_up_{mode}", stream=agg, source=origin,
                                               poke_interval=0.5, timeout=120, deferrable=False)
        assert sensor.execute(context={})["caught_up"] is True
        seen = read_numbers(cluster, agg)
        assert len(seen) == 2 * HALF and set(seen) == set(range(1, 2 * HALF + 1)), f"{mode}: lost messages"
        assert max(seen.values()) == 1, f"{mode}: duplicated messages"
        assert call(cluster, stream_info, origin)["state"]["messages"] == 0  # the WorkQueue is drained


def test_consumer_reset_during_the_consumers_leader_election(cluster_conn: EmbeddedNatsCluster) -> None:
    cluster = cluster_conn
    call(cluster, ensure_stream, {"name": "RST", "subjects": ["rst.>"], "num_replicas": 3})
    call(cluster, publish_numbered, "rst.x", 1, 100)
    call(cluster, ensure_consumer, "RST", {"name": "READER", "durable_name": "READER", "ack_policy": "explicit"})

    async def consume(conn, count: int) -> list[int]:
        sub = await conn.js.pull_subscribe_bind("READER", stream="RST")
        msgs = await sub.fetch(count, timeout=10)
        for msg in msgs:
            await msg.ack_sync()
        return [int(m.data) for m in msgs]

    assert call(cluster, consume, 60) == list(range(1, 61))
    victim = wait_for(lambda: cluster.consumer_leader("RST", "READER"), "a leader of READER")
    move_leader_off(cluster, "RST", victim)  # only the consumer's own group elects
    cluster.kill(victim)
    try:
        result = JetStreamConsumerResetOperator(task_id="replay", stream="RST", consumer="READER",
                                                start_seq=10).execute(context={})
    finally:
        cluster.restart(victim)
    assert result["reset_seq"] == 10 and result["num_pending"] == 91
    assert call(cluster, consume, 5) == [10, 11, 12, 13, 14]  # replayed from 10, nothing skipped


def test_reset_of_a_consumer_deleted_meanwhile_is_consumer_not_found(cluster_conn: EmbeddedNatsCluster) -> None:
    cluster = cluster_conn
    call(cluster, ensure_stream, {"name": "GONE", "subjects": ["gone.>"], "num_replicas": 3})
    call(cluster, ensure_consumer, "GONE", {"name": "C", "durable_name": "C", "ack_policy": "explicit"})

    async def main() -> None:
        settings = replace(cluster_settings(cluster), leader_wait=0.5, request_timeout=0.5)
        async with open_connection(settings) as conn:
            send = conn.api_request

            async def delete_first(api: str, *args, **kwargs):  # someone deletes it between lookup and reset
                if api.startswith("CONSUMER.RESET."):
                    await delete_consumer(conn, "GONE", "C")
                return await send(api, *args, **kwargs)

            conn.api_request = delete_first
            with pytest.raises(ConsumerNotFoundError) as err:
                await reset_consumer(conn, "GONE", "C", seq=1)
            assert "deleted during the reset" in str(err.value)

    asyncio.run(main())


def test_caught_up_trigger_waits_through_the_aggregates_election(cluster_conn: EmbeddedNatsCluster,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = cluster_conn
    call(cluster, ensure_stream, workqueue("TRG_ORIG", "trg.>"))
    JetStreamDurableSourceOperator(task_id="agg", stream="TRG_AGG", source="TRG_ORIG").execute(context={})
    call(cluster, publish_numbered, "trg.x", 1, 100)
    # every poll gives up on the election within ~1 s, so polls end in LeaderUnavailableError
    set_nats_cluster_connection(monkeypatch, "nats_default", cluster, leader_wait=0.5, request_timeout=0.5)
    victim = wait_for(lambda: cluster.stream_leader("TRG_AGG"), "a leader of TRG_AGG")
    cluster.kill(victim)
    try:
        trigger = JetStreamSourceCaughtUpTrigger(stream="TRG_AGG", source="TRG_ORIG", poll_interval=0.2)
        event = first_event_payload(trigger, timeout=90)
    finally:
        cluster.restart(victim)
    assert event["status"] == "success", event
    assert event["result"]["caught_up"] is True and call(cluster, stream_info, "TRG_AGG")["state"]["messages"] == 100
