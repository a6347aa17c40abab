"""Bounded storage: the ledger bucket and the claims bucket of process_each_once keep what they store for a
retention a user can see and change; a claim is one round trip; a bucket an older version made is upgraded by a
writer and only read by a reader."""

from __future__ import annotations

import asyncio
import json
import uuid

from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.kv.keys import claim, open_claims, release
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.store import DEFAULT_TTL
from tests.support.nats_calls import requests_of

DAY = 86400


def on_server(settings: ConnectionSettings, scenario):
    async def go():
        async with open_connection(settings) as conn:
            return await scenario(conn)

    return asyncio.run(go())


def name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


async def stream_config(conn, stream: str) -> dict:
    return (await conn.api_request(f"STREAM.INFO.{stream}"))["config"]


def test_a_new_ledger_bucket_keeps_keys_30_days_and_open_changes_what_it_is_told(settings):
    bucket = name("ledger")

    async def scenario(conn):
        created = await BatchLedger.open(conn, bucket)
        reopened = await BatchLedger.open(conn, bucket)  # nothing said: the bucket keeps its own
        bounded = await BatchLedger.open(conn, bucket, ttl="7d", max_bytes=64 * 1024 * 1024)
        forever = await BatchLedger.open(conn, bucket, ttl=0, max_bytes=-1)
        return created, reopened, bounded, forever, await stream_config(conn, f"KV_{bucket}")

    created, reopened, bounded, forever, config = on_server(settings, scenario)
    assert created.retention == reopened.retention == {"ttl": DEFAULT_TTL, "max_bytes": None}
    assert DEFAULT_TTL == 30 * DAY
    assert bounded.retention == {"ttl": 7 * DAY, "max_bytes": 64 * 1024 * 1024}
    assert forever.retention == {"ttl": None, "max_bytes": None}
    assert config["allow_atomic"] and config["allow_direct"]


def test_a_bucket_an_older_version_made_is_upgraded_by_a_writer_and_only_read_by_a_reader(settings):
    """Before counts, the bucket had neither allow_atomic nor allow_direct: a sensor's look lists the run and
    changes nothing (observing never writes); a writer's open() enables both and keeps the bucket's retention."""
    bucket = name("old_ledger")

    async def scenario(conn):
        from nats.js.api import KeyValueConfig

        kv = await conn.js.create_key_value(KeyValueConfig(bucket=bucket, history=1))
        await kv.create("r1.b1", json.dumps({
            "run_id": "r1", "batch_id": "b1", "stream": "S", "count": 4, "state": "published", "attempts": 0,
            "created_at": "2026-01-01T00:00:00+00:00", "updated_at": "2026-01-01T00:00:00+00:00"}).encode())
        looked = await BatchLedger(conn, bucket).summary("r1")
        untouched = await stream_config(conn, f"KV_{bucket}")
        writer = await BatchLedger.open(conn, bucket)
        return looked, untouched, writer.retention, await stream_config(conn, f"KV_{bucket}")

    looked, untouched, retention, upgraded = on_server(settings, scenario)
    assert looked["counted_by"] == "listing" and looked["batches"] == 1 and looked["messages"]["published"] == 4
    assert not untouched.get("allow_atomic") and not untouched.get("allow_direct")
    assert upgraded["allow_atomic"] and upgraded["allow_direct"]
    assert retention == {"ttl": None, "max_bytes": None}  # kept as it was: told nothing


def test_a_claim_is_one_round_trip_and_a_released_claim_can_be_made_again(settings):
    """Today's claim read the bucket's stream info before each create: two round trips per message."""
    bucket = name("claims")

    async def scenario(conn):
        kept = await open_claims(conn, bucket, ttl="2d", max_bytes=1024 * 1024)
        with requests_of(conn) as sent:
            first = [await claim(conn, bucket, f"ORDERS.{seq}", {"subject": "orders.ready"}) for seq in range(10)]
        repeat = await claim(conn, bucket, "ORDERS.3", {"subject": "orders.ready"})
        released = await release(conn, bucket, "ORDERS.4", first[4])
        again = await claim(conn, bucket, "ORDERS.4", {"subject": "orders.ready"})
        stale = await release(conn, bucket, "ORDERS.4", first[4])  # the claim moved on: not deleted
        return kept, sent, first, repeat, released, again, stale

    kept, sent, first, repeat, released, again, stale = on_server(settings, scenario)
    assert kept["ttl"] == 2 * DAY and kept["values"] == 0
    assert sent == [f"$KV.{bucket}.ORDERS.{seq}" for seq in range(10)]
    assert all(isinstance(rev, int) for rev in first) and repeat is None
    assert released and isinstance(again, int) and again > first[4] and not stale


def test_process_each_once_sets_the_claims_retention_it_is_given(settings, nats_conn):
    from airflow_jetstream.message_events import process_each_once

    bucket = name("processed")
    message = {"stream": "ORDERS", "stream_seq": 1, "subject": "orders.ready", "delivered": 1}
    assert process_each_once([message], lambda m: None, bucket=bucket) == {"processed": [1], "repeated": []}
    assert process_each_once([message], lambda m: None, bucket=bucket, ttl="1d", max_bytes=1 << 20) == {
        "processed": [], "repeated": [1]}

    async def config(conn):
        return await stream_config(conn, f"KV_{bucket}")

    stored = on_server(settings, config)
    assert (stored["max_age"], stored["max_bytes"]) == (DAY * 10**9, 1 << 20)


def test_writers_opening_a_new_ledger_bucket_at_once_all_open_it(settings, monkeypatch):
    """The partitions of a Spark write open the ledger bucket at once. One finds no bucket, and before it
    creates one another writer creates it and enables atomic batches: its create then meets a bucket of another
    config (10058, stream_name_in_use) and must use that bucket instead of failing (a Spark write failed so in a
    CI run). The second writer is held between its look and its create until the first has opened the bucket."""
    import airflow_jetstream.client.admin.streams as bucket_module

    first_opened = asyncio.Event()
    held: dict[str, object] = {}
    real_find = bucket_module.find_stream

    async def find_then_wait(conn, stream):
        found = await real_find(conn, stream)
        if asyncio.current_task() is held.get("task"):  # the held writer saw no bucket: the other goes first
            held["found"] = found
            await first_opened.wait()
        return found

    monkeypatch.setattr(bucket_module, "find_stream", find_then_wait)

    async def main() -> list[object]:
        async with open_connection(settings) as conn:
            name = f"opened_{uuid.uuid4().hex[:6]}"
            second = held["task"] = asyncio.ensure_future(BatchLedger.open(conn, name))
            while "found" not in held and not second.done():  # bounded: the held writer's one look
                await asyncio.sleep(0.01)
            try:
                first = await BatchLedger.open(conn, name)
            finally:
                first_opened.set()
            return [first, *(await asyncio.gather(second, return_exceptions=True))]

    outcomes = asyncio.run(asyncio.wait_for(main(), 60))
    assert "found" in held and held["found"] is None
    assert [o for o in outcomes if isinstance(o, BaseException)] == []
