"""Per-worker consumers against a real nats-server: create/update/no-op, cap, overlap, retry, last good."""

from __future__ import annotations

import asyncio
import threading

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client import metrics as metrics_module
from airflow_jetstream.client.admin.consumers import consumer_info, find_consumer
from airflow_jetstream.client.admin.worker_consumers import (
    WorkerConsumerManager,
    delete_worker_consumer,
    ensure_worker_consumer,
    normalize_subjects,
    worker_consumer_name,
)
from airflow_jetstream.client.errors import (
    ConnectionFailedError,
    ConsumerConfigError,
    InvalidRequestError,
    InvalidSubjectError,
    RequestTimeoutError,
    TooManySubjectsError,
)
from tests.support.polling import async_wait_until

STREAM = {"name": "ORDERS", "subjects": ["orders.>"]}


def _filters(info: dict) -> list[str]:
    return sorted(info["config"].get("filter_subjects") or [])


def in_server(settings: ConnectionSettings, scenario):
    async def go():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, STREAM)
            return await scenario(conn)

    return asyncio.run(go())


class RecordingSink:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.events: dict[str, threading.Event] = {}

    def on(self, name: str) -> threading.Event:
        return self.events.setdefault(name, threading.Event())

    def incr(self, name, count=1, tags=None):
        self.counts[name] = self.counts.get(name, 0) + count
        self.on(name).set()

    def timing(self, name, millis, tags=None):
        return None

    def gauge(self, name, value, tags=None):
        return None


@pytest.fixture
def sink():
    recording = RecordingSink()
    metrics_module.set_metrics_sink(recording)
    yield recording
    metrics_module.set_metrics_sink(None)


def test_normalize_subjects_dedupes_sorts_and_refuses_bad_sets():
    assert normalize_subjects(["orders.b", "orders.a", "orders.b"]) == ["orders.a", "orders.b"]
    assert normalize_subjects(["orders.eu.*", "orders.us.1", "orders.>x.y".replace(">x", "x")]) == [
        "orders.eu.*", "orders.us.1", "orders.x.y"]
    with pytest.raises(TooManySubjectsError) as cap:
        normalize_subjects([f"orders.{i}" for i in range(501)])
    assert cap.value.reason == "too_many_subjects" and "501 subjects" in cap.value.message
    assert len(normalize_subjects([f"orders.{i}" for i in range(501)], max_subjects=600)) == 501
    for overlapping in (["orders.*", "orders.eu"], ["orders.>", "orders.eu.1"], ["orders.*.1", "orders.eu.*"]):
        with pytest.raises(InvalidSubjectError) as overlap:
            normalize_subjects(overlapping)
        assert overlap.value.reason == "filter_subjects_overlap"
    assert normalize_subjects(["orders.*", "orders.eu.1"]) == ["orders.*", "orders.eu.1"]
    assert normalize_subjects(["orders.>", "other"]) == ["orders.>", "other"]
    with pytest.raises(InvalidRequestError) as empty:
        normalize_subjects([])
    assert empty.value.reason == "no_subjects"
    with pytest.raises(InvalidSubjectError):
        normalize_subjects("orders.a")
    with pytest.raises(InvalidSubjectError):
        normalize_subjects(["orders a"])
    assert worker_consumer_name("reader", 3) == "reader-3"
    with pytest.raises(InvalidSubjectError):
        worker_consumer_name("reader", "a.b")


def test_create_then_unchanged_then_update_in_place(settings):
    async def scenario(conn):
        created = await ensure_worker_consumer(conn, "ORDERS", "reader", "w1", ["orders.b", "orders.a"])
        same = await ensure_worker_consumer(conn, "ORDERS", "reader", "w1", ["orders.a", "orders.b", "orders.a"])
        await conn.js.publish("orders.c", b"c1")
        await conn.js.publish("orders.a", b"a1")
        updated = await ensure_worker_consumer(conn, "ORDERS", "reader", "w1", ["orders.a", "orders.c"])
        sub = await conn.js.pull_subscribe_bind("reader-w1", stream="ORDERS")
        msgs = await sub.fetch(2, timeout=2)
        for msg in msgs:
            await msg.ack()
        return created, same, updated, sorted(m.data for m in msgs)

    created, same, updated, data = in_server(settings, scenario)
    assert created["action"] == "created" and created["consumer"] == "reader-w1" and created["attempts"] == 1
    assert _filters(created["info"]) == ["orders.a", "orders.b"]
    assert created["info"]["config"]["inactive_threshold"] == 3600 * 10**9
    assert created["info"]["config"]["ack_policy"] == "explicit"
    assert same["action"] == "unchanged" and same["changed"] == []
    assert updated["action"] == "updated" and updated["changed"] == ["filter_subjects"]
    assert _filters(updated["info"]) == ["orders.a", "orders.c"]
    assert data == [b"a1", b"c1"]


def test_cap_and_owned_fields_fail_before_anything_is_sent(settings):
    async def scenario(conn):
        with pytest.raises(TooManySubjectsError):
            await ensure_worker_consumer(conn, "ORDERS", "reader", "big", [f"orders.{i}" for i in range(501)])
        with pytest.raises(InvalidRequestError) as owned:
            await ensure_worker_consumer(conn, "ORDERS", "reader", "big", ["orders.1"],
                                         config={"deliver_subject": "push.here"})
        return owned.value, await find_consumer(conn, "ORDERS", "reader-big")

    owned, found = in_server(settings, scenario)
    assert "deliver_subject" in owned.message
    assert found is None


def test_failed_update_keeps_last_good_config_and_manager_state(settings, sink):
    async def scenario(conn):
        manager = WorkerConsumerManager("ORDERS", "reader", "w2", retries=2, backoff=0.01)
        first = await manager.update(conn, ["orders.a"])
        suppressed = [await manager.update(conn, ["orders.a", "orders.a"]) for _ in range(3)]
        # the server refuses to change max_waiting (500/10012): a permanent failure, not retried
        bad = WorkerConsumerManager("ORDERS", "reader", "w2", retries=2, backoff=0.01, config={"max_waiting": 10})
        bad.subjects = manager.subjects
        with pytest.raises(ConsumerConfigError) as failed:
            await bad.update(conn, ["orders.a", "orders.b"])
        info = await consumer_info(conn, "ORDERS", "reader-w2")
        moved = await manager.update(conn, ["orders.b", "orders.c"])
        return manager, first, suppressed, bad, failed.value, info, moved

    manager, first, suppressed, bad, failed, info, moved = in_server(settings, scenario)
    assert first["action"] == "created" and first["added"] == ["orders.a"] and not first["suppressed"]
    assert all(s["suppressed"] and s["action"] == "unchanged" and s["info"] is None for s in suppressed)
    assert (failed.code, failed.err_code) == (500, 10012) and "max waiting" in failed.message
    assert _filters(info) == ["orders.a"]  # the server kept the last good config
    assert bad.subjects == ("orders.a",) and bad.pending == ("orders.a", "orders.b")
    assert bad.stats["failed"] == 1 and bad.last_error["err_code"] == 10012
    assert sink.counts.get("worker_consumer.update_retry", 0) == 0
    assert moved["action"] == "updated" and moved["added"] == ["orders.b", "orders.c"]
    assert moved["removed"] == ["orders.a"]
    assert manager.stats == {"created": 1, "updated": 1, "unchanged": 0, "noop_suppressed": 3, "failed": 0}
    assert sink.counts["worker_consumer.update_skipped"] == 3


def test_transient_failure_is_retried_with_backoff_until_the_server_is_back(nats_server, sink):
    """The server goes away mid-update: the first attempt times out, the retry after restart succeeds."""
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=1)
    retried = sink.on("worker_consumer.update_retry")

    def restart_after_first_retry():
        if retried.wait(timeout=30):
            nats_server.start()

    async def scenario(conn):
        manager = WorkerConsumerManager("ORDERS", "reader", "w3", retries=6, backoff=0.2, max_backoff=1.0)
        await manager.update(conn, ["orders.a"])
        nats_server.stop()
        helper = threading.Thread(target=restart_after_first_retry)
        helper.start()
        try:
            result = await manager.update(conn, ["orders.a", "orders.b"])
        finally:
            await asyncio.to_thread(helper.join)
        return manager, result, await consumer_info(conn, "ORDERS", "reader-w3")

    manager, result, info = in_server(settings, scenario)
    assert result["attempts"] >= 2 and sink.counts["worker_consumer.update_retry"] >= 1
    assert result["action"] == "updated" and manager.subjects == ("orders.a", "orders.b")
    assert _filters(info) == ["orders.a", "orders.b"]


def test_exhausted_retries_raise_and_retry_pending_applies_later(nats_server, sink):
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=0.5)

    async def scenario(conn):
        manager = WorkerConsumerManager("ORDERS", "reader", "w4", retries=1, backoff=0.01)
        await manager.update(conn, ["orders.a"])
        nats_server.stop()
        with pytest.raises(RequestTimeoutError):
            await manager.update(conn, ["orders.z"])
        state = (manager.subjects, manager.pending, manager.stats["failed"], manager.last_error["reason"])
        await asyncio.to_thread(nats_server.start)
        await async_wait_until(lambda: conn.nc.is_connected, "the client reconnected to the restarted server",
                               timeout=20)
        applied = await manager.retry_pending(conn)
        return state, applied, manager, await manager.retry_pending(conn)

    state, applied, manager, nothing = in_server(settings, scenario)
    assert state == (("orders.a",), ("orders.z",), 1, "timeout")
    assert sink.counts["worker_consumer.update_retry"] == 1 and sink.counts["worker_consumer.update_failed"] == 1
    assert applied["action"] == "updated" and _filters(applied["info"]) == ["orders.z"]
    assert manager.subjects == ("orders.z",) and manager.pending is None and nothing is None


def test_a_closed_connection_is_retried_then_raised_as_a_typed_error(settings, sink):
    async def scenario(conn):
        await conn.nc.close()
        with pytest.raises(ConnectionFailedError) as lost:
            await ensure_worker_consumer(conn, "ORDERS", "reader", "w5", ["orders.a"], retries=1, backoff=0.01)
        return lost.value

    lost = in_server(settings, scenario)
    assert lost.reason == "connection_lost" and "ConnectionClosedError" in lost.message
    assert "still failing after 1 retries (retries=1)" in lost.message
    assert sink.counts["worker_consumer.update_retry"] == 1 and sink.counts["worker_consumer.update_failed"] == 1


def test_inactive_threshold_lets_the_server_remove_an_abandoned_worker_consumer(settings):
    async def scenario(conn):
        created = await ensure_worker_consumer(conn, "ORDERS", "reader", "gone", ["orders.a"],
                                               inactive_threshold="500ms")
        async def gone() -> bool:
            return await find_consumer(conn, "ORDERS", "reader-gone") is None

        await async_wait_until(gone, "the server removing the inactive consumer reader-gone", timeout=20)
        removed = await gone()
        await ensure_worker_consumer(conn, "ORDERS", "reader", "kept", ["orders.b"])
        deleted = await delete_worker_consumer(conn, "ORDERS", "reader", "kept")
        again = await delete_worker_consumer(conn, "ORDERS", "reader", "kept")
        return created, removed, deleted, again

    created, removed, deleted, again = in_server(settings, scenario)
    assert created["info"]["config"]["inactive_threshold"] == 500_000_000
    assert removed and deleted and not again


def test_workqueue_handoff_removes_from_the_old_worker_before_adding_to_the_new(settings):
    """WorkQueue streams allow one consumer per subject: moving a subject is remove-then-add, and a
    message the old worker had not acked is delivered to the new owner (at least once, nothing lost)."""

    async def scenario(conn):
        await ensure_stream(conn, {"name": "WQ", "subjects": ["wq.>"], "retention": "workqueue"})
        old = WorkerConsumerManager("WQ", "wq", "A")
        new = WorkerConsumerManager("WQ", "wq", "B")
        await old.update(conn, ["wq.a", "wq.b"])
        with pytest.raises(ConsumerConfigError) as overlap:
            await new.update(conn, ["wq.b"])
        for i in range(3):
            await conn.js.publish("wq.b", f"b{i}".encode())
        in_flight = (await (await conn.js.pull_subscribe_bind("wq-A", stream="WQ")).fetch(1, timeout=2))[0]
        await old.update(conn, ["wq.a"])
        await new.update(conn, ["wq.b"])
        received = await (await conn.js.pull_subscribe_bind("wq-B", stream="WQ")).fetch(3, timeout=2)
        for msg in [*received, in_flight]:
            await msg.ack()
        async def left() -> int:
            return (await conn.api_request("STREAM.INFO.WQ"))["state"]["messages"]

        async def drained() -> bool:
            return await left() == 0

        await async_wait_until(drained, "the acked messages removed from the WorkQueue stream", timeout=10)
        return overlap.value, in_flight.data, sorted(m.data for m in received), await left(), new.pending

    overlap, in_flight, received, left, pending = in_server(settings, scenario)
    assert overlap.reason == "workqueue_filter_not_unique" and "remove it from the other" in overlap.message
    assert pending is None  # the later retry with the subject freed succeeded
    assert in_flight == b"b0" and received == [b"b0", b"b1", b"b2"]
    assert left == 0
