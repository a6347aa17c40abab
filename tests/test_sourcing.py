"""Durable sourcing: provisioning, local validation, health check and migration (real nats-server)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from airflow_jetstream.client import ensure_stream, stream_info
from airflow_jetstream.client.admin.consumers import ensure_consumer, find_consumer
from airflow_jetstream.client.admin.streams import find_stream
from airflow_jetstream.client.errors import (
    ConsumerConfigError,
    ConsumerNotFoundError,
    InvalidRequestError,
    StreamConfigError,
)
from airflow_jetstream.client.sourcing.provision import (
    DurableSource,
    provision_durable_source,
    server_managed_consumer,
    wait_source_healthy,
)
from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator
from tests.support.nats_calls import call_on_server as run
from tests.support.polling import async_wait_until

# ---------------------------------------------------------------- helpers shared by the sourcing tests




async def publish(conn, prefix: str, count: int, *, start: int = 0, window: int = 2000) -> None:
    """Publish ``prefix.<i>`` with payload/msg-id ``<prefix>-<i>`` for i in [start, start+count); returns once the
    stream acknowledged every one (``publish_async`` returns a future of the ack: awaiting the call only sends)."""
    for base in range(start, start + count, window):
        acks = await asyncio.gather(*(conn.js.publish_async(f"{prefix}.{i % 10}", f"{prefix}-{i}".encode(),
                                                            headers={"Nats-Msg-Id": f"{prefix}-{i}"})
                                      for i in range(base, min(base + window, start + count))))
        await asyncio.gather(*acks)


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    await async_wait_until(check, what, timeout, every=0.1)


async def _has_messages(conn, stream: str) -> bool:
    return await messages(conn, stream) > 0


async def messages(conn, stream: str) -> int:
    return int((await stream_info(conn, stream))["state"]["messages"])


async def payloads(conn, stream: str) -> Counter:
    """Every payload stored in ``stream`` (read with an ack-none pull consumer)."""
    expected = await messages(conn, stream)
    sub = await conn.js.pull_subscribe(">", stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    seen: Counter = Counter()
    try:
        while sum(seen.values()) < expected:
            for msg in await sub.fetch(1000, timeout=5):
                seen[msg.data.decode()] += 1
    finally:
        await sub.unsubscribe()
    return seen


async def wait_sourced(conn, aggregate: str, origin: str, total: int, timeout: float = 60.0) -> None:
    """Wait until ``aggregate`` holds ``total`` messages and ``origin`` is empty."""
    async def done() -> bool:
        return await messages(conn, aggregate) >= total and await messages(conn, origin) == 0
    await wait_for(done, timeout, f"{total} messages in {aggregate} and {origin} empty")


def assert_exactly_once(seen: Counter, prefix: str, count: int, start: int = 0) -> None:
    expected = {f"{prefix}-{i}" for i in range(start, start + count)}
    mine = {k: v for k, v in seen.items() if k.startswith(prefix + "-")}
    missing = expected - set(mine)
    dups = {k: v for k, v in mine.items() if v > 1}
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
    assert not dups, f"{len(dups)} duplicated, e.g. {list(dups.items())[:5]}"
    assert len(mine) == count


# ---------------------------------------------------------------- local validation (nothing sent)


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"start_seq": 0}, "invalid_start"),
    ({"start_seq": 5, "start_time": "2026-01-01T00:00:00Z"}, "invalid_start"),
    ({"start_time": "yesterday"}, "invalid_request"),
    ({"filter_subjects": ("o.>", "o.1")}, "invalid_filter"),
    ({"filter_subjects": ("o..x",)}, "invalid_subject"),
    ({"user_managed": {"deliver_subject": "deliver.*"}}, "invalid_source_consumer"),
    ({"user_managed": {"consumer": "bad.name"}}, "invalid_source_consumer"),
    ({"user_managed": {"max_ack_pending": -1}}, "max_ack_pending_required"),
    ({"user_managed": {"deliver_policy": "last_per_subject"}}, "invalid_field"),
    ({"start_seq": 3, "user_managed": {"deliver_policy": "last"}}, "invalid_field"),
    ({"user_managed": {"deliver_policy": "by_start_sequence"}}, "invalid_field"),
    ({"user_managed": {"replay_policy": "fast"}}, "invalid_field"),
])
def test_bad_input_is_refused_before_any_call(kwargs, reason, nats_conn, settings):
    op = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN", **kwargs)
    with pytest.raises((InvalidRequestError, ConsumerConfigError)) as info:
        op.execute(context={})
    assert info.value.reason == reason, str(info.value)
    assert run(settings, find_stream, "AGG") is None


def test_limits_origin_refused_in_server_mode_naming_user_mode(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"]})
    op = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN")
    with pytest.raises(StreamConfigError) as info:
        op.execute(context={})
    assert info.value.reason == "origin_not_durable_capable"
    assert "user_managed={...}" in str(info.value)
    assert run(settings, find_stream, "AGG") is None


def test_missing_origin_is_a_clear_error(nats_conn):
    op = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="NOPE", user_managed=True)
    with pytest.raises(Exception) as info:
        op.execute(context={})
    assert "origin stream 'NOPE' does not exist" in str(info.value)


# ---------------------------------------------------------------- server-managed


@pytest.mark.parametrize("retention", ["workqueue", "interest"])
def test_server_managed_source_is_durable_and_idempotent(retention, nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"], "retention": retention})
    run(settings, ensure_stream, {"name": "OTHER", "subjects": ["x.>"]})
    run(settings, ensure_stream, {"name": "AGG", "subjects": ["agg.>"], "sources": [{"name": "OTHER"}]})
    op = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN")
    first = op.execute(context={})
    json.dumps(first)
    assert first["mode"] == "server" and first["action"] == "updated"
    assert first["consumer"].startswith("JS_SRC_")
    assert first["source_state"]["active"] >= 0 and "error" not in first["source_state"]
    run(settings, publish, "o", 200)
    run(settings, wait_sourced, "AGG", "ORIGIN", 200)
    again = op.execute(context={})
    assert again["action"] == "unchanged" and again["consumer"] == first["consumer"]
    sources = run(settings, stream_info, "AGG")["config"]["sources"]
    assert sorted(s["name"] for s in sources) == ["ORIGIN", "OTHER"]
    consumer = run(settings, find_consumer, "ORIGIN", first["consumer"])
    assert consumer["config"]["ack_policy"] == "flow_control"
    assert_exactly_once(run(settings, payloads, "AGG"), "o", 200)


def test_server_managed_mirror_with_filter(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "workqueue"})
    op = JetStreamDurableSourceOperator(task_id="src", stream="MIR", source="ORIGIN", mirror=True,
                                        filter_subjects=["o.1"])
    result = op.execute(context={})
    assert result["action"] == "created" and result["consumer"].startswith("JS_MIRROR_")
    run(settings, publish, "o", 50)
    assert run(settings, stream_info, "MIR")["config"]["mirror"]["filter_subject"] == "o.1"
    assert run(settings, _poll, lambda c: _count_is(c, "MIR", 5))
    assert set(run(settings, payloads, "MIR")) == {f"o-{i}" for i in range(1, 50, 10)}
    assert op.execute(context={})["action"] == "unchanged"


def test_user_managed_mirror_of_a_workqueue(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "workqueue"})
    run(settings, publish, "o", 30)
    op = JetStreamDurableSourceOperator(task_id="m", stream="MIR", source="ORIGIN", user_managed=True, mirror=True)
    result = op.execute(context={})
    assert result["mirror"] is True and result["consumer"] == "MIR_SRC_ORIGIN"
    assert run(settings, stream_info, "MIR")["config"]["mirror"]["consumer"]["name"] == "MIR_SRC_ORIGIN"
    assert run(settings, _poll, lambda c: _count_is(c, "MIR", 30))
    assert run(settings, _poll, lambda c: _count_is(c, "ORIGIN", 0))
    assert op.execute(context={})["action"] == "unchanged"
    narrowed = JetStreamDurableSourceOperator(task_id="m", stream="MIR", source="ORIGIN", user_managed=True,
                                              mirror=True, filter_subjects=["o.1"]).execute(context={})
    assert narrowed["action"] == "updated"  # the filter lives on the consumer, which can change
    assert run(settings, find_consumer, "ORIGIN", "MIR_SRC_ORIGIN")["config"]["filter_subject"] == "o.1"
    with pytest.raises(StreamConfigError) as info:
        JetStreamDurableSourceOperator(task_id="s", stream="MIR", source="ORIGIN",
                                       user_managed=True).execute(context={})
    assert "is a mirror" in str(info.value)


async def _poll(conn, check) -> bool:
    await wait_for(lambda: check(conn), 20, "condition")
    return True


# ---------------------------------------------------------------- user-managed


def test_user_managed_source_creates_flow_control_consumer(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "interest"})
    run(settings, ensure_stream, {"name": "OTHER", "subjects": ["x.>"]})
    run(settings, ensure_stream, {"name": "AGG", "sources": [{"name": "OTHER"}]})
    op = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN", filter_subjects=["o.1", "o.2"],
                                        user_managed={"consumer": "AGG_IN", "deliver_subject": "deliver.agg",
                                                      "replay_policy": "instant", "max_ack_pending": 500})
    result = op.execute(context={})
    json.dumps(result)
    assert result["consumer"] == "AGG_IN" and result["deliver_subject"] == "deliver.agg"
    cfg = run(settings, find_consumer, "ORIGIN", "AGG_IN")["config"]
    assert cfg["ack_policy"] == "flow_control" and cfg["flow_control"] is True
    assert cfg["idle_heartbeat"] == 1_000_000_000 and cfg["max_deliver"] == -1
    assert cfg["max_ack_pending"] == 500 and not cfg.get("ack_wait") and not cfg.get("backoff")
    assert sorted(cfg["filter_subjects"]) == ["o.1", "o.2"]
    entry = next(s for s in run(settings, stream_info, "AGG")["config"]["sources"] if s["name"] == "ORIGIN")
    assert entry["consumer"] == {"name": "AGG_IN", "deliver_subject": "deliver.agg"}
    assert "filter_subject" not in entry and "opt_start_seq" not in entry
    run(settings, publish, "o", 100)
    assert run(settings, _poll, lambda c: _count_is(c, "AGG", 20))
    assert run(settings, _poll, lambda c: _count_is(c, "ORIGIN", 0))
    assert op.execute(context={})["action"] == "unchanged"
    assert {s["name"] for s in run(settings, stream_info, "AGG")["config"]["sources"]} == {"OTHER", "ORIGIN"}


def test_user_managed_start_and_last_per_subject(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"]})
    run(settings, publish, "o", 40)  # o.0 .. o.9, four times each
    by_seq = JetStreamDurableSourceOperator(task_id="a", stream="FROM_SEQ", source="ORIGIN", user_managed=True,
                                            start_seq="31").execute(context={})
    last = JetStreamDurableSourceOperator(task_id="b", stream="LAST", source="ORIGIN", filter_subjects="o.>",
                                          user_managed={"deliver_policy": "last_per_subject"}).execute(context={})
    assert by_seq["consumer"] == "FROM_SEQ_SRC_ORIGIN" and last["consumer"] == "LAST_SRC_ORIGIN"
    assert run(settings, _poll, lambda c: _count_is(c, "FROM_SEQ", 10))
    assert run(settings, _poll, lambda c: _count_is(c, "LAST", 10))
    assert set(run(settings, payloads, "LAST")) == {f"o-{i}" for i in range(30, 40)}
    assert set(run(settings, payloads, "FROM_SEQ")) == {f"o-{i}" for i in range(30, 40)}


async def _count_is(conn, stream: str, count: int) -> bool:
    return await messages(conn, stream) == count


def test_existing_non_flow_control_consumer_is_refused_naming_the_fix(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"]})
    run(settings, ensure_consumer, "ORIGIN", {"name": "PLAIN", "ack_policy": "explicit", "deliver_subject": "d.p"})
    op = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN",
                                        user_managed={"consumer": "PLAIN"})
    with pytest.raises(ConsumerConfigError) as info:
        op.execute(context={})
    assert info.value.reason == "immutable_field" and "ack_policy" in str(info.value)
    existing = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN",
                                              user_managed={"consumer": "PLAIN", "create_consumer": False})
    with pytest.raises(ConsumerConfigError) as info:
        existing.execute(context={})
    assert info.value.reason == "consumer_not_flow_control" and "'flow_control'" in str(info.value)
    assert run(settings, find_stream, "AGG") is None


def test_workqueue_origin_needs_deliver_all(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "workqueue"})
    op = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN", user_managed=True, start_seq=5)
    with pytest.raises(ConsumerConfigError) as info:
        op.execute(context={})
    assert info.value.reason == "workqueue_needs_deliver_all"
    assert run(settings, find_stream, "AGG") is None


def test_deliver_subject_overlapping_a_stream_is_refused(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"]})
    op = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN",
                                        user_managed={"deliver_subject": "o.deliver"})
    with pytest.raises(ConsumerConfigError) as info:
        op.execute(context={})
    assert "overlaps subject 'o.>'" in str(info.value)
    assert run(settings, find_consumer, "ORIGIN", "AGG_SRC_ORIGIN") is None


# ---------------------------------------------------------------- health check (silent failures)


def test_health_check_reports_10217_for_a_non_flow_control_consumer(settings):
    async def go(conn) -> Exception:
        await ensure_stream(conn, {"name": "ORIGIN", "subjects": ["o.>"]})
        await ensure_consumer(conn, "ORIGIN", {"name": "PLAIN", "ack_policy": "explicit", "deliver_subject": "d.p"})
        await conn.api_request("STREAM.CREATE.AGG", {"name": "AGG", "sources": [
            {"name": "ORIGIN", "consumer": {"name": "PLAIN", "deliver_subject": "d.p"}}]})
        spec = DurableSource("AGG", "ORIGIN", mode="user", consumer="PLAIN", deliver_subject="d.p").validated()
        with pytest.raises(ConsumerConfigError) as info:
            await wait_source_healthy(conn, spec, timeout=10)
        return info.value

    err = run(settings, go)
    assert err.err_code == 10217 and err.reason == "consumer_not_flow_control"
    assert "flow-control push consumer" in str(err)


def test_health_check_names_a_missing_consumer(settings):
    async def go(conn) -> Exception:
        await ensure_stream(conn, {"name": "ORIGIN", "subjects": ["o.>"]})
        await conn.api_request("STREAM.CREATE.AGG", {"name": "AGG", "sources": [
            {"name": "ORIGIN", "consumer": {"name": "GHOST", "deliver_subject": "d.g"}}]})
        spec = DurableSource("AGG", "ORIGIN", mode="user", consumer="GHOST", deliver_subject="d.g").validated()
        with pytest.raises(ConsumerNotFoundError) as info:
            await wait_source_healthy(conn, spec, timeout=1.5)
        return info.value

    err = run(settings, go)
    assert err.reason == "source_consumer_missing"
    assert "'GHOST'" in str(err) and "active -1" in str(err)


def test_create_consumer_false_with_missing_consumer_fails_before_touching_the_stream(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "workqueue"})
    op = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN",
                                        user_managed={"consumer": "PRECREATED", "create_consumer": False})
    with pytest.raises(ConsumerNotFoundError) as info:
        op.execute(context={})
    assert info.value.reason == "source_consumer_missing"
    assert run(settings, find_stream, "AGG") is None


# ---------------------------------------------------------------- migration from plain sourcing


@pytest.mark.parametrize("retention", ["limits", "interest", "workqueue"])
def test_migration_to_user_managed_while_publishing_loses_and_duplicates_nothing(retention, nats_conn, settings):
    total = 6000

    async def go(conn) -> dict:
        await ensure_stream(conn, {"name": "ORIGIN", "subjects": ["o.>"], "retention": retention})
        await ensure_stream(conn, {"name": "AGG", "sources": [{"name": "ORIGIN"}]})
        if retention != "limits":  # an Interest stream drops what is published before the server's consumer exists
            await server_managed_consumer(conn, DurableSource("AGG", "ORIGIN"), timeout=10)
        await publish(conn, "o", 2000)
        await wait_for(lambda: _has_messages(conn, "AGG"), 20, "the plain source to deliver something")
        publisher = asyncio.ensure_future(publish(conn, "o", total - 2000, start=2000, window=200))
        spec = DurableSource("AGG", "ORIGIN", mode="user")
        result = await provision_durable_source(conn, spec)
        await publisher

        async def done() -> bool:
            if await messages(conn, "AGG") < total:
                return False
            return retention == "limits" or await messages(conn, "ORIGIN") == 0
        await wait_for(done, 60, "migrated sourcing to finish")
        result["seen"] = await payloads(conn, "AGG")
        return result

    result = run(settings, go)
    assert result["action"] == "migrated"
    assert result["migrated_after_seq"] > 0
    assert_exactly_once(result["seen"], "o", total)
    entry = run(settings, stream_info, "AGG")["config"]["sources"][0]
    assert entry["consumer"]["name"] == "AGG_SRC_ORIGIN"
    assert run(settings, _consumer_names, "ORIGIN") == ["AGG_SRC_ORIGIN"]


async def _consumer_names(conn, stream: str) -> list[str]:
    reply = await conn.api_request(f"CONSUMER.NAMES.{stream}")
    return sorted(reply.get("consumers") or [])


def test_user_to_server_mode_is_refused(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "workqueue"})
    JetStreamDurableSourceOperator(task_id="u", stream="AGG", source="ORIGIN", user_managed=True).execute(context={})
    with pytest.raises(StreamConfigError) as info:
        JetStreamDurableSourceOperator(task_id="s", stream="AGG", source="ORIGIN").execute(context={})
    assert "deliver messages twice" in str(info.value)
