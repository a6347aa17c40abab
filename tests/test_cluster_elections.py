"""Election gaps on a 3-node cluster (issue 11, part C): the Batcher's individual publishes and the
msg-id probes of atomic batches are retried while their R3 stream has no leader, and the message
and KV sensors and triggers keep waiting through it instead of failing.

"No leader" is made deterministic: two of the three nodes are SIGKILLed (quorum lost) and stay down
until the test has seen the client hit the leaderless stream; the survivor leads none of the
streams involved, so it answers publishes with a 503 / no responders, as during an election.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
from airflow_jetstream.client.batches.atomic import fence_count, publish_atomic_batch
from airflow_jetstream.client.batches.batcher import Batcher
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.batches.wire import stored_sequences
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import (
    BatchPublishError,
    InvalidRequestError,
    LeaderUnavailableError,
    PlacementError,
)
from airflow_jetstream.client.kv import keys
from airflow_jetstream.client.kv.bucket import ensure_bucket
from airflow_jetstream.client.kv.keys import put_key
from airflow_jetstream.client.reading import read_plan
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsCluster
from airflow_jetstream.embedded.cluster import CLUSTER_NAME
from airflow_jetstream.sensors.kv import JetStreamKeyValueSensor
from airflow_jetstream.sensors.message import JetStreamMessageSensor
from airflow_jetstream.triggers.await_message import JetStreamAwaitMessageTrigger
from airflow_jetstream.triggers.kv import JetStreamKeyValueTrigger
from tests.conftest import set_nats_cluster_connection
from tests.support.cluster_tools import call, move_leader_off, publish_numbered, wait_for

SURVIVOR = "n3"


def is_ready(message: Message) -> bool:
    """apply_function of the message sensor and trigger (by dotted path)."""
    return message.data == b"ready"


class Seen(logging.Handler):
    """Collects log messages so a test can wait (bounded) until the client has met the outage."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    async def wait(self, *needles: str, limit: float = 60.0) -> None:
        for _ in range(int(limit / 0.05)):
            if all(any(n in m for m in self.messages) for n in needles):
                return
            await asyncio.sleep(0.05)
        pytest.fail(f"no log line with each of {needles} within {limit}s; seen: {self.messages[-20:]}")


@contextmanager
def seen_logs() -> Iterator[Seen]:
    handler = Seen()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def quorum_lost(cluster: EmbeddedNatsCluster) -> list[str]:
    """SIGKILL every node but SURVIVOR and wait until the survivor has no route left (bounded)."""
    down = [n.name for n in cluster.nodes if n.name != SURVIVOR]
    for name in down:
        cluster.kill(name)
    survivor = cluster.node(SURVIVOR)
    wait_for(lambda: not survivor.monitor("routez").get("routes"), f"{SURVIVOR} to drop its routes", limit=30)
    return down


def restart(cluster: EmbeddedNatsCluster, down: list[str]) -> None:
    for name in down:
        cluster.node(name).start()
    cluster.wait_healthy()


def test_batcher_publishes_and_msg_id_probes_are_retried_while_the_stream_has_no_leader(
        nats_cluster_module: EmbeddedNatsCluster) -> None:
    cluster = nats_cluster_module
    call(cluster, ensure_stream, {"name": "GAPS", "subjects": ["gaps.>"], "num_replicas": 3})
    call(cluster, publish_numbered, "gaps.p", 1, 3)  # msg ids m1..m3 at seqs 1..3
    move_leader_off(cluster, "GAPS", SURVIVOR)
    settings = ConnectionSettings(servers=cluster.node(SURVIVOR).url, connect_timeout=2, request_timeout=3,
                                  leader_wait=120)
    probes = [BatchMessage("gaps.p", b"", msg_id=f"m{n}") for n in (1, 2, 3)] + [
        BatchMessage("gaps.p", b"", msg_id="never-sent")]

    async def main():
        async with open_connection(settings) as conn:
            down = await asyncio.to_thread(quorum_lost, cluster)
            try:
                with seen_logs() as seen:
                    batcher = Batcher(conn, max_batch=2, flush_interval=60, fence=False)  # one group
                    items = asyncio.gather(batcher.publish("gaps.b", b"with-id", msg_id="b1"),
                                           batcher.publish("gaps.b", b"without-id"))
                    probed = asyncio.ensure_future(stored_sequences(conn, probes))
                    # both met the leaderless stream (a 503) and are retrying (their retry lines, or those
                    # of the stream lookup that follows a 503, name the subject)
                    await seen.wait("gaps.b", "gaps.p")
            finally:
                await asyncio.to_thread(restart, cluster, down)
            results = await items
            await batcher.close()
            seqs = await probed
            last = int((await stream_info(conn, "GAPS"))["state"]["last_seq"])
            stored = [bytes(m[4]) async for chunk in read_range(conn, "GAPS", 1, last) for m in chunk]
            return results, seqs, stored

    results, seqs, stored = asyncio.run(main())
    assert [(r.error, r.message) for r in results] == [("", ""), ("", "")]
    assert sorted(r.seq for r in results) == [4, 5]
    assert seqs == [1, 2, 3, None]
    assert sorted(stored) == [b"1", b"2", b"3", b"with-id", b"without-id"]  # each once


def test_a_fenced_batcher_group_rides_out_a_leaderless_stream_and_stores_each_item_once(
        nats_cluster_module: EmbeddedNatsCluster) -> None:
    """The default Batcher's group is a fenced atomic batch: re-sent while its R3 stream has no leader, stored once
    with its fences when the quorum is back, and the same items sent again are answered as duplicates."""
    cluster = nats_cluster_module
    call(cluster, ensure_stream, {"name": "GAPF", "subjects": ["gapf.>"], "num_replicas": 3, "allow_atomic": True})
    move_leader_off(cluster, "GAPF", SURVIVOR)
    settings = ConnectionSettings(servers=cluster.node(SURVIVOR).url, connect_timeout=2, request_timeout=3,
                                  leader_wait=120)

    async def main():
        async with open_connection(settings) as conn:
            async with Batcher(conn, max_batch=2, flush_interval=60) as batcher:  # each group: two items
                warm = await asyncio.gather(batcher.publish("gapf.a", b"w1", msg_id="w1"),
                                            batcher.publish("gapf.a", b"w2", msg_id="w2"))
                down = await asyncio.to_thread(quorum_lost, cluster)
                try:
                    with seen_logs() as seen:
                        items = asyncio.gather(batcher.publish("gapf.a", b"f1", msg_id="f1"),
                                               batcher.publish("gapf.a", b"f2", msg_id="f2"))
                        await seen.wait("gapf.a")
                finally:
                    await asyncio.to_thread(restart, cluster, down)
                results = await items
                again = await asyncio.gather(batcher.publish("gapf.a", b"f1", msg_id="f1"),
                                             batcher.publish("gapf.a", b"f2", msg_id="f2"))
            last = int((await stream_info(conn, "GAPF"))["state"]["last_seq"])
            stored = [bytes(m[4]) async for chunk in read_range(conn, "GAPF", 1, last, subjects=["gapf.>"])
                      for m in chunk]
            return warm, results, again, stored

    warm, results, again, stored = asyncio.run(main())
    assert [r.seq for r in warm] == [1, 3] and all(r.ok for r in warm + results)
    assert [r.seq for r in results] == [5, 7], "each item followed by its fence"
    assert [(r.duplicate, r.seq) for r in again] == [(True, 5), (True, 7)]
    assert stored == [b"w1", b"w2", b"f1", b"f2"]


def test_msg_id_probes_leave_a_replicated_stream_writable(nats_cluster_module: EmbeddedNatsCluster) -> None:
    """nats-server 2.14/2.15 stop storing into a replicated stream after a publish whose
    Nats-Expected-Last-Msg-Id mismatches (checked when the message is applied): probes of ids that
    were never stored must not carry it there, and may be repeated (2.12 answered a repeat 10158)."""
    cluster = nats_cluster_module
    call(cluster, ensure_stream, {"name": "PROBED", "subjects": ["probed.>"], "num_replicas": 3, "allow_atomic": True})
    call(cluster, publish_numbered, "probed.p", 1, 3)  # msg ids m1..m3 at seqs 1..3
    settings = ConnectionSettings(servers=cluster.servers, connect_timeout=2, request_timeout=3, leader_wait=10)

    def probes(*ids: str) -> list[BatchMessage]:
        return [BatchMessage("probed.p", b"", msg_id=i) for i in ids]

    async def main():
        async with open_connection(settings) as conn:
            first = await stored_sequences(conn, probes("m2", "never-a", "never-b"))
            again = await stored_sequences(conn, probes("never-a", "m3", "never-b"))
            # an atomic batch re-using a stored id beside a new one: refused whole, recognised by probes
            with pytest.raises(BatchPublishError) as reused:
                await publish_atomic_batch(conn, probes("m1", "never-c"))
            ack = await conn.js.publish("probed.p", b"after the probes", timeout=5)
            return first, again, reused.value.reason, ack.seq, (await stream_info(conn, "PROBED"))["state"]["messages"]

    first, again, reused, seq, messages = asyncio.run(main())
    assert (first, again, reused) == ([2, None, None], [None, 3, None], "duplicate_msg_id")
    assert (seq, messages) == (4, 4), "the probes stored nothing and left the stream writable"


def test_message_and_kv_sensors_and_triggers_wait_through_a_leaderless_stream(
        nats_cluster_module: EmbeddedNatsCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = nats_cluster_module
    call(cluster, ensure_stream, {"name": "GAPM", "subjects": ["gapm.>"], "num_replicas": 3})
    call(cluster, ensure_bucket, "gapkv", num_replicas=3)
    for stream in ("GAPM", "KV_gapkv"):
        move_leader_off(cluster, stream, SURVIVOR)
    # leader_wait=0: each call gives up at once, so what the sensors and triggers do with it shows
    set_nats_cluster_connection(monkeypatch, "nats_gaps", cluster, leader_wait=0, request_timeout=3)
    message_sensor = JetStreamMessageSensor(task_id="message", stream="GAPM", start=1,
                                            apply_function="tests.test_cluster_elections.is_ready",
                                            nats_conn_id="nats_gaps", deferrable=False)
    kv_sensor = JetStreamKeyValueSensor(task_id="kv", bucket="gapkv", key="model", value="ready",
                                        nats_conn_id="nats_gaps", deferrable=False)
    triggers = [
        JetStreamAwaitMessageTrigger(stream="GAPM", start_seq=1, apply_function="tests.test_cluster_elections.is_ready",
                                     nats_conn_id="nats_gaps", fetch_timeout=1),
        JetStreamKeyValueTrigger(bucket="gapkv", key="model", value="ready", nats_conn_id="nats_gaps"),
    ]

    # the triggers' own logs go to structlog: spy on the client calls they make instead
    elections: dict[str, int] = {"message": 0, "kv": 0}

    def spy(module, name: str, key: str) -> None:
        real = getattr(module, name)

        async def wrapper(*args, **kwargs):
            try:
                return await real(*args, **kwargs)
            except LeaderUnavailableError:
                elections[key] += 1
                raise

        monkeypatch.setattr(module, name, wrapper)

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    async def main():
        down = await asyncio.to_thread(quorum_lost, cluster)
        try:
            pokes = [await asyncio.to_thread(sensor.poke, {}) for sensor in (message_sensor, kv_sensor)]
            spy(read_plan, "find_message", "message")  # the triggers import these when they run
            spy(keys, "wait_for_key", "kv")
            waits = [asyncio.ensure_future(first_event(t)) for t in triggers]
            for _ in range(1200):  # bounded: until each trigger met the election twice (it kept waiting)
                if min(elections.values()) >= 2 or any(w.done() for w in waits):
                    break
                await asyncio.sleep(0.05)
            assert min(elections.values()) >= 2, elections
            assert not any(w.done() for w in waits)
        finally:
            await asyncio.to_thread(restart, cluster, down)
        settings = ConnectionSettings(servers=cluster.servers, connect_timeout=2, request_timeout=3,
                                      leader_wait=60)
        async with open_connection(settings) as conn, Batcher(conn, fence=False) as batcher:  # both ride it out
            published = await batcher.publish("gapm.x", b"ready")
            await conn.retry_leader("put model", lambda: put_key(conn, "gapkv", "model", "ready"))
        async with asyncio.timeout(120):
            events = await asyncio.gather(*waits)
        return pokes, published, events

    pokes, published, (message_event, kv_event) = asyncio.run(main())
    assert [bool(p) for p in pokes] == [False, False]  # "not yet", not a failed task
    assert published.ok, published.to_dict()
    assert message_event["status"] == "matched" and message_event["message"]["seq"] == published.seq
    assert kv_event["status"] == "matched" and kv_event["entry"]["value"] == "ready"


def test_spark_writer_creates_its_ledger_and_job_buckets_with_the_replicas_and_placement_it_is_given(
        nats_cluster_module: EmbeddedNatsCluster) -> None:
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from airflow_jetstream.spark.options import WriteOptions
    from airflow_jetstream.spark.writer import JetStreamWriter

    cluster = nats_cluster_module
    call(cluster, ensure_stream, {"name": "GAPW", "subjects": ["gapw.>"], "num_replicas": 3, "allow_atomic": True})
    schema = StructType([StructField("subject", StringType()), StructField("payload", BinaryType())])
    rows = pa.record_batch([pa.array(["gapw.x"] * 3), pa.array([b"a", b"b", b"c"])], names=["subject", "payload"])

    def options(bucket: str, **extra: str) -> WriteOptions:
        return WriteOptions.parse({"servers": cluster.servers, "request_timeout": "3", "stream": "GAPW",
                                   "job_id": bucket, "ledger_bucket": f"{bucket}_ledger",
                                   "job_bucket": f"{bucket}_jobs", **extra})

    with pytest.raises(InvalidRequestError, match="ledger_replicas must be an integer from 1 to 5"):
        options("bad", ledger_replicas="7")
    nowhere = JetStreamWriter(options("nowhere", ledger_placement_cluster="nowhere"), schema)
    with pytest.raises(PlacementError):  # refused before anything is published
        nowhere.write(iter([rows]))
    placed = JetStreamWriter(options("placed", ledger_replicas="1", ledger_placement_cluster=CLUSTER_NAME), schema)
    placed.commit([placed.write(iter([rows]))])

    async def configs(conn):
        return ([(await stream_info(conn, f"KV_placed_{kind}"))["config"] for kind in ("ledger", "jobs")],
                (await stream_info(conn, "GAPW"))["state"]["messages"] - await fence_count(conn, "GAPW"))

    buckets, stored = call(cluster, configs)
    assert [(c["num_replicas"], c["placement"]["cluster"]) for c in buckets] == [(1, CLUSTER_NAME)] * 2
    assert stored == 3  # only the placed write stored its rows (its chunk's fence not counted)
