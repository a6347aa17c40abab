"""Interop with an independent client: nats.js v3 (pinned in tests/interop/package-lock.json, installed by
``make install`` with ``npm ci``) writes and reads beside the provider on one real nats-server.

Covered both ways: atomic batches, the batch ledger (key format and value schema of docs/contracts.md),
repeated and non-ASCII headers, binary payloads, and every data source column type (writer -> reader
and nats.js -> reader, Spark local[2]).
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from airflow_jetstream.client import BatchMessage, publish_atomic_batch, stream_info
from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import BatchPublishError, LedgerRecordError
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.records import batch_key, counts_key, shard_of
from airflow_jetstream.client.reading.headers import header_values
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.support.spark_session import local_spark

INTEROP = Path(__file__).resolve().parent / "interop"
SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs/schemas/ledger-record.schema.json").read_text())
COUNTS_SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs/schemas/ledger-counts.schema.json").read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    if not shutil.which("node") or not (INTEROP / "node_modules" / "@nats-io" / "jetstream").is_dir():
        pytest.fail("nats.js is not installed: run `make install` (npm ci in tests/interop)")
    with EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("interop")) as srv:
        yield srv


@pytest.fixture(scope="module")
def settings(server: EmbeddedNatsServer) -> ConnectionSettings:
    return ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=5)


def js(server: EmbeddedNatsServer, op: str, **args: Any) -> Any:
    """Run one nats.js operation (tests/interop/client.mjs) and return its JSON result."""
    done = subprocess.run(["node", str(INTEROP / "client.mjs"), json.dumps({"op": op, "servers": server.url, **args})],
                          capture_output=True, text=True, timeout=60, cwd=INTEROP)
    assert done.returncode == 0, f"nats.js {op} failed: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def on_server(settings: ConnectionSettings, body) -> Any:
    async def main() -> Any:
        async with open_connection(settings) as conn:
            return await body(conn)

    return asyncio.run(main())


async def stored(conn, stream: str) -> list[tuple]:
    state = (await stream_info(conn, stream))["state"]
    out: list[tuple] = []
    async for chunk in read_range(conn, stream, state["first_seq"], state["last_seq"]):
        out.extend(chunk)
    return out


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


BINARY = bytes(range(256))


def test_a_nats_js_atomic_batch_is_read_and_its_msg_id_not_taken_for_another_batch(server, settings) -> None:
    on_server(settings, lambda conn: ensure_stream(conn, {"name": "JSATOM", "subjects": ["jsatom.>"],
                                                        "allow_atomic": True}))
    ack = js(server, "atomic_batch", msg_id="js-1", messages=[
        {"subject": "jsatom.a", "data_b64": b64(BINARY), "headers": [["X-Multi", "a"], ["X-Multi", "b"]]},
        {"subject": "jsatom.b", "data_b64": b64(b"two"), "headers": [["X-Text", "grüße €"]]},
        {"subject": "jsatom.a", "data_b64": b64(b"three")},
    ])
    assert ack["count"] == 3

    async def body(conn):
        messages = await stored(conn, "JSATOM")
        other = [BatchMessage("jsatom.a", f"new-{i}".encode(), msg_id="js-1" if i == 0 else None) for i in range(5)]
        with pytest.raises(BatchPublishError) as reused:
            await publish_atomic_batch(conn, other)
        return messages, reused.value, (await stream_info(conn, "JSATOM"))["state"]["last_seq"]

    messages, reused, last_seq = on_server(settings, body)
    assert [m[4] for m in messages] == [BINARY, b"two", b"three"]
    first, second, third = (m[3] for m in messages)
    assert {h["Nats-Batch-Id"] for h in (first, second, third)} == {ack["batch"]}
    assert [h["Nats-Batch-Sequence"] for h in (first, second, third)] == ["1", "2", "3"]
    assert third["Nats-Batch-Commit"] == "1" and first["Nats-Msg-Id"] == "js-1"
    assert header_values(first)["X-Multi"] == ["a", "b"] and second["X-Text"] == "grüße €"
    assert reused.reason == "msg_id_reused" and last_seq == ack["seq"]  # nothing new stored, no false range


def test_a_provider_atomic_batch_is_read_by_nats_js(server, settings) -> None:
    async def body(conn):
        await ensure_stream(conn, {"name": "PYATOM", "subjects": ["pyatom.>"], "allow_atomic": True})
        return await publish_atomic_batch(conn, [
            BatchMessage("pyatom.a", BINARY, headers={"X-Multi": ["a", "b"], "X-Text": "grüße €"}, msg_id="py-1"),
            BatchMessage("pyatom.b", b"two", msg_id="py-2"),
        ], batch_id="py-batch-1")

    result = on_server(settings, body)
    got = js(server, "get", stream="PYATOM", first=result.first_seq, last=result.last_seq)
    assert [base64.b64decode(m["data_b64"]) for m in got] == [BINARY, b"two"]
    first, second = (m["headers"] for m in got)
    assert first["X-Multi"] == ["a", "b"] and first["X-Text"] == ["grüße €"]
    assert first["Nats-Batch-Id"] == second["Nats-Batch-Id"] == ["py-batch-1"]
    assert (first["Nats-Batch-Sequence"], second["Nats-Batch-Sequence"]) == (["1"], ["2"])
    assert second["Nats-Batch-Commit"] == ["1"] and "Nats-Batch-Commit" not in first
    assert (first["Nats-Msg-Id"], second["Nats-Msg-Id"]) == (["py-1"], ["py-2"])


def test_event_payloads_keep_repeated_headers_from_nats_js(server, settings) -> None:
    from airflow_jetstream.client.reading.messages import Message
    from airflow_jetstream.triggers.message import message_payload

    async def body(conn):
        await ensure_stream(conn, {"name": "JSEVT", "subjects": ["jsevt.>"]})
        js(server, "publish", subject="jsevt.a", json={"id": 1}, headers=[["X-Multi", "a"], ["X-Multi", "b"],
                                                                        ["X-One", "1"]])
        sub = await conn.js.pull_subscribe("jsevt.a", durable="evt", stream="JSEVT")
        msg = (await sub.fetch(1, timeout=5))[0]
        await msg.ack()
        return message_payload(Message.from_delivery(msg))

    payload = on_server(settings, body)
    assert payload["headers"] == {"X-Multi": ["a", "b"], "X-One": "1"} and payload["json"] == {"id": 1}
    json.dumps(payload)


def test_the_ledger_is_read_and_updated_from_javascript(server, settings) -> None:
    """nats.js, written from docs/contracts.md, computes the keys, reads the records and counts, and changes
    records the contract's way (record + counts shard in one atomic batch, each compare-and-set): the provider's
    counts then agree with a recount of the records."""
    import jsonschema

    run_id, batch_id = "run 2026-01-01/eu.1", "bätch.0"
    key = batch_key(run_id, batch_id)
    assert js(server, "ledger_key", run_id=run_id, batch_id=batch_id) == key  # the documented escaping
    for some_id in (batch_id, "js-made", "b-17", "x" * 200):  # the documented shard of a batch (CRC-32 % 16)
        expected = counts_key(run_id, shard_of(some_id))
        assert js(server, "ledger_counts_key", run_id=run_id, batch_id=some_id) == expected

    async def record(conn):
        ledger = await BatchLedger.open(conn, "interop_ledger")
        return await ledger.record(run_id, batch_id, stream="ORDERS", count=3, first_seq=1, last_seq=3)

    on_server(settings, record)
    entry = js(server, "kv_get", bucket="interop_ledger", key=key)
    jsonschema.validate(entry["value"], SCHEMA)
    counts = js(server, "kv_get", bucket="interop_ledger", key=counts_key(run_id, shard_of(batch_id)))
    jsonschema.validate(counts["value"], COUNTS_SCHEMA)
    assert counts["value"]["states"]["published"] == 1 and counts["value"]["batches"] == 1
    js(server, "ledger_write", bucket="interop_ledger",
       value={**entry["value"], "x_js": {"service": "billing", "tags": ["a"]}, "meta": {"from": "js"}})
    js_only = {"run_id": run_id, "batch_id": "js-made", "stream": "ORDERS", "count": 2, "first_seq": 4,
               "last_seq": 5, "state": "published", "attempts": 0, "created_at": "2026-01-01T00:00:00.000Z",
               "updated_at": "2026-01-01T00:00:00.000Z", "x_js": 1}
    js(server, "ledger_write", bucket="interop_ledger", value=js_only)

    async def consume(conn):
        ledger = await BatchLedger.open(conn, "interop_ledger")
        before = await ledger.summary(run_id)
        claims = await ledger.claim_available(run_id, owner="spark")
        await ledger.settle(claims)
        return before, len(claims), await ledger.summary(run_id), await ledger.recount(run_id)

    before, claimed, summary, recounted = on_server(settings, consume)
    assert before["counted_by"] == "counts" and before["batches"] == 2 and before["messages"]["published"] == 5
    assert claimed == 2 and summary["states"]["consumed"] == 2 and summary["messages"]["consumed"] == 5
    assert recounted["drift"] == {} and recounted["shards"] == []
    after = js(server, "kv_get", bucket="interop_ledger", key=key)["value"]
    jsonschema.validate(after, SCHEMA)
    assert after["state"] == "consumed" and after["x_js"] == {"service": "billing", "tags": ["a"]}
    assert after["meta"] == {"from": "js"}
    assert js(server, "kv_get", bucket="interop_ledger", key=batch_key(run_id, "js-made"))["value"]["x_js"] == 1

    # a writer of the old contract (the record alone) makes the counts drift: a recount finds and repairs it
    old_style = js(server, "kv_get", bucket="interop_ledger", key=batch_key(run_id, "js-made"))
    js(server, "kv_update", bucket="interop_ledger", key=batch_key(run_id, "js-made"), revision=old_style["revision"],
       value={**old_style["value"], "state": "published", "attempts": 0})

    async def repair(conn):
        ledger = await BatchLedger.open(conn, "interop_ledger")
        return await ledger.recount(run_id), await ledger.recount(run_id, repair=True), await ledger.summary(run_id)

    found, repaired, fixed = on_server(settings, repair)
    assert found["drift"]["states"] == {
        "counted": {"published": 0, "in_progress": 0, "consumed": 2, "failed": 0},
        "recounted": {"published": 1, "in_progress": 0, "consumed": 1, "failed": 0}}
    assert repaired["repaired"] and fixed["states"]["published"] == 1 and fixed["states"]["consumed"] == 1

    bad = js(server, "kv_get", bucket="interop_ledger", key=key)
    js(server, "kv_update", bucket="interop_ledger", key=key, revision=bad["revision"],
       value={**bad["value"], "count": "3"})

    async def read_bad(conn):
        ledger = await BatchLedger.open(conn, "interop_ledger")
        with pytest.raises(LedgerRecordError) as err:
            await ledger.get(run_id, batch_id)
        return err.value

    err = on_server(settings, read_bad)
    assert key in err.message and "'count'" in err.message


# --- the data source: every column type ---------------------------------------------------------

SCHEMA_DDL = ("s string, l long, i int, sh short, by byte, d double, f float, ok boolean, dec decimal(10,2), "
              "day date, ts timestamp, ntz timestamp_ntz, bin binary, arr array<long>, m map<string,long>, "
              "st struct<a:string,b:double>")
ROW = {
    "s": "grüße", "l": 2**62, "i": -2**31, "sh": 32767, "by": -128, "d": 1.5, "f": 0.25, "ok": True,
    "dec": Decimal("12.30"), "day": date(2026, 1, 2), "ts": datetime(2026, 1, 1, 12, 0, 0, 123000, tzinfo=UTC),
    "ntz": datetime(2026, 1, 1, 12, 0), "bin": BINARY, "arr": [1, 2], "m": {"k": 7}, "st": {"a": "x", "b": 2.5},
}
NULLS = dict.fromkeys(ROW)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    yield from local_spark("test-interop-js", conf={"spark.sql.session.timeZone": "UTC"})


def as_python(row: Any) -> dict[str, Any]:
    out = row.asDict(recursive=True)
    if out["ts"] is not None:
        out["ts"] = out["ts"].replace(tzinfo=UTC)  # collected in the session time zone (UTC), naive
    if out["bin"] is not None:
        out["bin"] = bytes(out["bin"])
    return out


def test_every_column_type_round_trips_writer_to_reader_and_nats_js_to_reader(server, settings, spark) -> None:
    on_server(settings, lambda conn: ensure_stream(conn, {"name": "ROWS", "subjects": ["rows.>"],
                                                        "allow_atomic": True}))
    spark.createDataFrame([ROW, NULLS], SCHEMA_DDL).coalesce(1).write.format("jetstream").mode("append").options(
        servers=server.url, stream="ROWS", subject="rows.py", job_id="interop-rows").save()
    written = json.loads(on_server(settings, lambda conn: stored(conn, "ROWS"))[0][4])
    assert written["ts"] == "2026-01-01T12:00:00.123000Z" and written["ntz"] == "2026-01-01T12:00:00"
    assert written["dec"] == "12.30" and written["bin"] == b64(BINARY) and written["day"] == "2026-01-02"

    # what a JavaScript service writes for the same row: Date.toISOString(), numbers, base64, objects
    js_row = {"s": "grüße", "l": 2**53 - 1, "i": -2**31, "sh": 32767, "by": -128, "d": 1.5, "f": 0.25, "ok": True,
              "dec": 12.3, "day": "2026-01-02", "ts": "2026-01-01T12:00:00.123Z", "ntz": "2026-01-01T12:00:00",
              "bin": b64(BINARY), "arr": [1, 2], "m": {"k": 7}, "st": {"a": "x", "b": 2.5}}
    js(server, "publish", subject="rows.js", json=js_row, headers=[["X-Multi", "a"], ["X-Multi", "b"]])
    js(server, "publish", subject="rows.bad", json={"l": 1.7})

    def read(schema: str, **options: str) -> list[Any]:
        return (spark.read.format("jetstream").schema(schema)
                .options(servers=server.url, stream="ROWS", decode="json", **options).load().collect())

    rows = read(f"subject string, headers map<string,array<string>>, {SCHEMA_DDL}", filter_subjects="rows.py,rows.js")
    data = {name: [] for name in ("rows.py", "rows.js")}
    for row in rows:
        values = as_python(row)
        data[values.pop("subject")].append(values)
    written_rows = sorted(data["rows.py"], key=lambda v: v["s"] is None)
    assert [{k: v for k, v in r.items() if k != "headers"} for r in written_rows] == [ROW, NULLS]
    assert written_rows[0]["headers"]["Nats-Batch-Sequence"] == ["1"]
    (from_js,) = data["rows.js"]
    assert from_js == {**ROW, "l": 2**53 - 1, "headers": {"X-Multi": ["a", "b"]}}

    with pytest.raises(Exception, match="column 'l'") as failed:  # 1.7 is not a long: never truncated to 1
        read("l long", filter_subjects="rows.bad")
    assert "invalid_json" in str(failed.value) or "message" in str(failed.value)
    permissive = read("l long, _corrupt_record string", filter_subjects="rows.bad", json_mode="permissive")
    assert [(r["l"], r["_corrupt_record"]) for r in permissive] == [(None, '{"l":1.7}')]
