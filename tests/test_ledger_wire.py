"""What the batch ledger relies on from nats-server (docs/ledger.md, "Server facts it relies on"), checked on the
server the suite runs (2.15 in `make test`, 2.12.8 in the compat leg): if a release changes one, this fails first."""

from __future__ import annotations

import asyncio
import json
import uuid

from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.ledger.store import CasConflict, Write, read_last, write
from airflow_jetstream.client.reading.stored import last_per_subject


def on_server(settings: ConnectionSettings, scenario):
    async def go():
        async with open_connection(settings) as conn:
            return await scenario(conn)

    return asyncio.run(go())


async def kv_bucket(conn, *, atomic: bool = True) -> str:
    from nats.js.api import KeyValueConfig

    bucket = f"wire_{uuid.uuid4().hex[:10]}"
    await conn.js.create_key_value(KeyValueConfig(bucket=bucket, history=1))
    if atomic:
        info = await conn.api_request(f"STREAM.INFO.KV_{bucket}")
        await conn.api_request(f"STREAM.UPDATE.KV_{bucket}",
                               {**info["config"], "allow_atomic": True, "allow_direct": True})
    return bucket


def test_an_atomic_batch_checks_each_subjects_last_sequence_and_stores_all_or_nothing(settings):
    async def scenario(conn):
        bucket = await kv_bucket(conn)
        first = await write(conn, bucket, [Write("r.a", b"1", 0), Write("r./counts.0", b"1", 0)], context="t")
        with_wrong_second: Exception | None = None
        try:
            await write(conn, bucket, [Write("r.a", b"2", first - 1), Write("r./counts.0", b"2", 1)], context="t")
        except CasConflict as exc:
            with_wrong_second = exc
        kept = await read_last(conn, bucket, ["r.a", "r./counts.0"])
        both = await write(conn, bucket, [Write("r.a", b"3", first - 1), Write("r./counts.0", b"3", first)],
                           context="t")
        return first, with_wrong_second, kept, both

    first, refused, kept, both = on_server(settings, scenario)
    assert first == 2 and isinstance(refused, CasConflict) and "wrong last sequence" in str(refused)
    assert {k: (e.seq, e.data) for k, e in kept.items()} == {"r.a": (1, b"1"), "r./counts.0": (2, b"1")}
    assert both == 4


def test_a_kv_bucket_made_by_nats_py_has_neither_atomic_nor_direct_until_updated(settings):
    async def scenario(conn):
        bucket = await kv_bucket(conn, atomic=False)
        before = (await conn.api_request(f"STREAM.INFO.KV_{bucket}"))["config"]
        await conn.api_request(f"STREAM.UPDATE.KV_{bucket}", {**before, "allow_atomic": True, "allow_direct": True})
        after = (await conn.api_request(f"STREAM.INFO.KV_{bucket}"))["config"]
        return before, after

    before, after = on_server(settings, scenario)
    assert not before.get("allow_atomic") and not before.get("allow_direct")
    assert after["allow_atomic"] and after["allow_direct"]


def test_multi_last_reads_literal_keys_and_filters_with_delete_markers_in_one_request(settings):
    async def scenario(conn):
        bucket = await kv_bucket(conn)
        kv = await conn.js.key_value(bucket)
        for key in ("r1.a", "r1.b", "r1./counts.0", "r1./counts.3", "r2./counts.1"):
            await kv.put(key, key.encode())
        await kv.delete("r1.b")
        stream, prefix = f"KV_{bucket}", f"$KV.{bucket}."
        mixed = await last_per_subject(conn, stream, [prefix + "r1.a", prefix + "r1.b", prefix + "r1.zz",
                                                      prefix + "r1./counts.*"])
        none = await last_per_subject(conn, stream, [prefix + "r9./counts.*"])
        return prefix, mixed, none

    prefix, mixed, none = on_server(settings, scenario)
    assert sorted(mixed) == sorted(prefix + k for k in ("r1.a", "r1.b", "r1./counts.0", "r1./counts.3"))
    assert mixed[prefix + "r1.b"].headers.get("KV-Operation") == "DEL"
    assert mixed[prefix + "r1.a"].data == b"r1.a" and none == {}


def test_counters_cannot_live_in_a_kv_bucket_so_a_record_and_its_count_cannot_be_one_batch(settings):
    async def scenario(conn):
        bucket = await kv_bucket(conn)
        info = await conn.api_request(f"STREAM.INFO.KV_{bucket}")
        reply = await conn.nc.request(f"$JS.API.STREAM.UPDATE.KV_{bucket}",
                                      json.dumps({**info["config"], "allow_msg_counter": True}).encode())
        return json.loads(reply.data)

    refused = on_server(settings, scenario)
    assert refused["error"]["err_code"] == 10052 and "discard new" in refused["error"]["description"]
