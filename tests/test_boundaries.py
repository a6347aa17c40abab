"""Correct at every boundary (issue 14): no silent wrong results on one real nats-server for the module.

Each test sends the bytes another client would (raw nats-py requests with hand-written headers,
KV values written without the provider) and checks the provider refuses or keeps them correctly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_jetstream.client import BatchMessage, publish_atomic_batch, stream_info
from airflow_jetstream.client.admin.streams import api_view, ensure_stream
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.durations import to_nanos, to_seconds
from airflow_jetstream.client.errors import BatchPublishError, InvalidRequestError, JetStreamError, LedgerRecordError
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.counts import LEDGER_COUNTS_SCHEMA, empty_counts
from airflow_jetstream.client.ledger.records import LEDGER_RECORD_SCHEMA, batch_key, schema_problem
from airflow_jetstream.client.natspy_internals import write_raw
from airflow_jetstream.client.reading.headers import header_values, headers_json, parse_header_lines
from airflow_jetstream.client.reading.stored import get_message, read_range
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.conftest import set_nats_connection

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "docs" / "schemas" / "ledger-record.schema.json"
COUNTS_SCHEMA_FILE = SCHEMA_FILE.with_name("ledger-counts.schema.json")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    with EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("boundaries"), jetstream={"domain": "hub"}) as srv:
        yield srv


@pytest.fixture
def settings(server: EmbeddedNatsServer) -> ConnectionSettings:
    return ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=3)


def on_server(settings: ConnectionSettings, body) -> object:
    async def main() -> object:
        async with open_connection(settings) as conn:
            return await body(conn)

    return asyncio.run(main())


async def raw_batch(conn, subject: str, batch_id: str, payloads: list[bytes], first_msg_id: str | None) -> dict:
    """An atomic batch as another client sends it: plain requests with the Nats-Batch-* headers."""
    reply = None
    for index, payload in enumerate(payloads, start=1):
        headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(index)}
        if index == 1 and first_msg_id:
            headers["Nats-Msg-Id"] = first_msg_id
        if index == len(payloads):
            headers["Nats-Batch-Commit"] = "1"
        reply = await conn.nc.request(subject, payload, timeout=3, headers=headers)
    return json.loads(reply.data)


# --- a reused msg id ----------------------------------------------------------------------------

def test_a_reused_msg_id_is_refused_not_reported_as_an_earlier_commit(settings: ConnectionSettings) -> None:
    """The issue's case: another client's batch carries msg id raw-1; a *different* batch whose first
    msg id is raw-1 used to return already_committed with a range the stream never stored."""

    async def body(conn) -> tuple[dict, BatchPublishError, int]:
        await ensure_stream(conn, {"name": "REUSE", "subjects": ["reuse.>"], "allow_atomic": True})
        ack = await raw_batch(conn, "reuse.a", "rawbatch1", [b"r1", b"r2", b"r3"], "raw-1")
        before = (await stream_info(conn, "REUSE"))["state"]["last_seq"]
        new = [BatchMessage("reuse.a", f"new-{i}".encode(), msg_id="raw-1" if i == 0 else None) for i in range(5)]
        with pytest.raises(BatchPublishError) as caught:
            await publish_atomic_batch(conn, new)
        return ack, caught.value, before, (await stream_info(conn, "REUSE"))["state"]["last_seq"]

    ack, error, before, after = on_server(settings, body)
    assert ack["count"] == 3 and before == after == ack["seq"]
    assert error.reason == "msg_id_reused"
    assert "fresh msg ids" in error.message and "REUSE" in error.message


def test_same_ids_with_other_content_are_refused_and_a_true_retry_is_recognised(settings: ConnectionSettings) -> None:
    async def body(conn):
        await ensure_stream(conn, {"name": "RETRY", "subjects": ["retry.>"], "allow_atomic": True})
        batch = [BatchMessage("retry.a", f"m{i}".encode(), headers={"X-Run": "1"}, msg_id=f"job1-{i}")
                 for i in range(4)]
        first = await publish_atomic_batch(conn, batch)
        again = await publish_atomic_batch(conn, batch)  # a retry after a lost ack: same content
        changed = [BatchMessage(m.subject, m.data + b"!", headers=m.headers, msg_id=m.msg_id) for m in batch]
        with pytest.raises(BatchPublishError) as caught:
            await publish_atomic_batch(conn, changed)
        return first, again, caught.value, (await stream_info(conn, "RETRY"))["state"]["messages"]

    first, again, error, stored = on_server(settings, body)
    assert again.already_committed and (again.first_seq, again.last_seq) == (first.first_seq, first.last_seq)
    assert error.reason == "msg_id_reused" and stored == 4


# --- durations ----------------------------------------------------------------------------------

def test_durations_are_seconds_timedeltas_or_strings() -> None:
    assert to_nanos(86400) == to_nanos("1d") == to_nanos(timedelta(days=1)) == to_nanos("86400") == 86400 * 10**9
    assert to_nanos(0.25) == to_nanos("250ms") == 250_000_000
    assert to_seconds("1h30m") == 5400.0 and to_seconds(1.5) == 1.5
    assert to_nanos(10**9) == 10**18  # a large int is seconds too (no nanoseconds reading)
    with pytest.raises(InvalidRequestError, match=r"ack_wait: .* longer than the server can store") as info:
        to_nanos(60_000_000_000, field="ack_wait")  # nanoseconds given by mistake: over 292 years as seconds
    assert info.value.reason == "invalid_duration"
    for text in ("60000000000", "3000000000d"):  # strings are held to the same bound (they once passed unchecked)
        with pytest.raises(InvalidRequestError, match=r"longer than the server can store"):
            to_nanos(text)
    from airflow_jetstream.client.admin.streams import normalize_stream_config

    once = normalize_stream_config({"name": "S", "duplicate_window": "500ms", "max_age": 3600})
    assert normalize_stream_config(once) == once == {"name": "S", "duplicate_window": 500_000_000,
                                                     "max_age": 3600 * 10**9}  # normalizing twice is safe
    for bad in (True, -1, "soon", float("nan"), "-5s"):
        with pytest.raises(InvalidRequestError) as err:
            to_nanos(bad, field="max_age")
        assert err.value.reason == "invalid_duration" and "max_age" in err.value.message


def test_advisory_capture_max_age_and_ledger_ttl_are_seconds(server, settings, monkeypatch) -> None:
    from airflow_jetstream.operators.advisory import JetStreamAdvisoryStreamOperator

    set_nats_connection(monkeypatch, "nats_default", server.url)
    capture = JetStreamAdvisoryStreamOperator(task_id="capture", capture_stream="ADV_SECONDS", max_age=86400)
    result = capture.execute(context={})
    assert result["action"] in ("created", "updated")
    assert result["max_age"] == 86400  # the XCom speaks seconds too

    async def body(conn):
        await BatchLedger.open(conn, "ttl_ledger", ttl=3600, visibility_timeout=600)
        return (await stream_info(conn, "ADV_SECONDS"))["config"], (await stream_info(conn, "KV_ttl_ledger"))["config"]

    capture, ledger = on_server(settings, body)
    assert capture["max_age"] == 86400 * 10**9  # one day, not 86 microseconds
    assert ledger["max_age"] == 3600 * 10**9


# --- api_view -----------------------------------------------------------------------------------

def test_api_view_js_targets_the_other_domain(settings: ConnectionSettings) -> None:
    async def body(conn):
        hub = api_view(conn, domain="hub")
        elsewhere = api_view(conn, domain="edge")
        info = await hub.js.account_info()
        requested = await hub.api_request("INFO")  # the view's own API requests go to its prefix too
        with pytest.raises(JetStreamError):
            await elsewhere.api_request("INFO", retry=False)
        with pytest.raises(Exception) as missing:  # nothing answers $JS.edge.API here
            await elsewhere.js.account_info()
        return hub.js._prefix, elsewhere.js._prefix, info, requested, missing.value

    hub_prefix, edge_prefix, info, requested, missing = on_server(settings, body)
    assert (hub_prefix, edge_prefix) == ("$JS.hub.API", "$JS.edge.API")
    assert info.domain == "hub"
    assert requested["domain"] == "hub"
    assert type(missing).__name__ in ("NoRespondersError", "TimeoutError", "ServiceUnavailableError")


# --- repeated headers ---------------------------------------------------------------------------

def test_repeated_headers_keep_every_value_on_a_real_message(settings: ConnectionSettings) -> None:
    raw = b"X-Multi: a\r\nX-One: 1\r\nX-Multi: b\r\n"
    assert parse_header_lines(raw) == {"X-Multi": "b", "X-One": "1"}  # nats-py's dict (last value)
    assert header_values(parse_header_lines(raw)) == {"X-Multi": ["a", "b"], "X-One": ["1"]}

    async def body(conn):
        await ensure_stream(conn, {"name": "HDRS", "subjects": ["hdrs.>"], "allow_direct": True})
        frame = (b"HPUB hdrs.a ack.hdrs 46 48\r\nNATS/1.0\r\nX-Multi: a\r\nX-Multi: b\r\nX-One: 1\r\n\r\n"
                 b"hi\r\n")
        sub, acks = await conn.nc.subscribe("hdrs.a"), await conn.nc.subscribe("ack.hdrs")
        await write_raw(conn.nc, frame)  # the wire bytes nats.js / Go send for append()/Add()
        msg = await sub.next_msg(timeout=3)
        assert json.loads((await acks.next_msg(timeout=3)).data)["seq"] == 1  # stored
        read = {}
        for via in ("consumer", "direct"):
            async for chunk in read_range(conn, "HDRS", 1, 1, via=via):
                read[via] = header_values(chunk[0][3])
        for direct in (True, False):  # one message, by direct get and by message get
            stored = await get_message(conn, "HDRS", seq=1, direct=direct)
            read[f"get direct={direct}"] = header_values(stored.headers)
        return msg.headers, read

    headers, read = on_server(settings, body)
    assert headers_json(headers) == {"X-Multi": ["a", "b"], "X-One": "1"}
    assert read["consumer"] == read["direct"] == {"X-Multi": ["a", "b"], "X-One": ["1"]}
    assert read["get direct=True"] == read["get direct=False"] == read["direct"]

    from pyspark.sql.types import ArrayType, MapType, StringType, StructField, StructType

    from airflow_jetstream.spark.options import ReadOptions
    from airflow_jetstream.spark.reader import _Columns

    options = ReadOptions.parse({"servers": "nats://127.0.0.1:4222", "stream": "S"})
    for value_type, expected in ((StringType(), [("X-Multi", "a, b"), ("X-One", "1")]),
                                 (ArrayType(StringType()), [("X-Multi", ["a", "b"]), ("X-One", ["1"])])):
        columns = _Columns(StructType([StructField("headers", MapType(StringType(), value_type))]), options)
        assert columns.batch([("hdrs.a", 1, 0, headers, b"hi")]).column(0).to_pylist() == [expected]


# --- ledger values written by another service ---------------------------------------------------

def test_ledger_keeps_unknown_fields_and_checks_types_naming_key_and_field(settings: ConnectionSettings) -> None:
    run_id, batch_id = "run 1/eu", "b.0"
    key = batch_key(run_id, batch_id)

    async def body(conn):
        ledger = await BatchLedger.open(conn, "other_service")
        record = {"run_id": run_id, "batch_id": batch_id, "stream": "ORDERS", "count": 3, "first_seq": 1,
                  "last_seq": 3, "state": "published", "attempts": 0, "created_at": "2026-01-01T00:00:00Z",
                  "updated_at": "2026-01-01T00:00:00Z", "meta": {}, "x_service": {"owner": "billing", "v": 2}}
        kv = await conn.js.key_value(ledger.bucket)
        await kv.put(key, json.dumps(record).encode())  # written by a service in another language
        claim = await ledger.claim(run_id, batch_id, owner="spark")
        await ledger.mark_consumed(claim)
        stored = json.loads((await kv.get(key)).value)
        await kv.put(key, json.dumps({**record, "count": "3"}).encode())
        with pytest.raises(LedgerRecordError) as bad:
            await ledger.get(run_id, batch_id)
        return stored, bad.value

    stored, bad = on_server(settings, body)
    assert stored["state"] == "consumed" and stored["x_service"] == {"owner": "billing", "v": 2}
    assert bad.reason == "ledger_record_invalid" and key in bad.message and "'count'" in bad.message


def test_the_published_schema_is_the_one_the_ledger_checks() -> None:
    import jsonschema

    published = json.loads(SCHEMA_FILE.read_text())
    assert published == LEDGER_RECORD_SCHEMA
    good = {"run_id": "r", "batch_id": "b", "stream": "S", "count": 1, "state": "published", "other": [1]}
    bad = [{**good, "count": "1"}, {**good, "state": "done"}, {**good, "first_seq": 0}, {"run_id": "r"},
           {**good, "stream": ""}, {**good, "deadline": 5}, {**good, "count": True}]
    jsonschema.validate(good, published)
    assert schema_problem(LEDGER_RECORD_SCHEMA, good) is None
    for value in bad:
        assert schema_problem(LEDGER_RECORD_SCHEMA, value) is not None
        assert not jsonschema.Draft202012Validator(published).is_valid(value), value


def test_the_published_counts_schema_is_the_one_the_ledger_checks() -> None:
    import jsonschema

    published = json.loads(COUNTS_SCHEMA_FILE.read_text())
    assert published == LEDGER_COUNTS_SCHEMA
    good = empty_counts("r", 3)
    bad = [{**good, "batches": -1}, {**good, "shard": "3"}, {**good, "states": []}, {"run_id": "r"},
           {**good, "next_deadline": 5}, {**good, "batches": True}]
    jsonschema.validate(good, published)
    assert schema_problem(LEDGER_COUNTS_SCHEMA, good) is None
    for value in bad:
        assert schema_problem(LEDGER_COUNTS_SCHEMA, value) is not None
        assert not jsonschema.Draft202012Validator(published).is_valid(value), value


# --- the data source's JSON rows ----------------------------------------------------------------

@pytest.mark.parametrize(("payload", "problem"), [
    (b"[1]", "JSON array"), (b"7", "JSON number"), (b'"s"', "JSON string"), (b"null", "JSON null"),
    (b"", "empty"), (b'{"n": 1.7}', "column 'n': 1.7 is not an integer"), (b'{"n": NaN}', "NaN"),
    (b'\xef\xbb\xbf{"n": 1}', "byte order mark"), (b'{"n": 99999999999999999999}', "column 'n'"),
    (b'{"n": "\xff"}', "not UTF-8"),
])
def test_json_rows_are_refused_naming_message_and_problem(payload: bytes, problem: str) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from airflow_jetstream.spark.options import ReadOptions
    from airflow_jetstream.spark.reader import _Columns

    schema = StructType([StructField("n", LongType()), StructField("_corrupt_record", StringType())])
    strict = _Columns(schema, ReadOptions.parse({"servers": "nats://127.0.0.1:4222", "stream": "S", "decode": "json"}))
    with pytest.raises(InvalidRequestError) as err:
        strict.batch([("orders.eu", 41, 0, None, b'{"n": 1}'), ("orders.eu", 42, 0, None, payload)])
    assert err.value.reason == "invalid_json" and "message 42 (orders.eu)" in err.value.message
    assert problem in err.value.message
    lenient = _Columns(schema, ReadOptions.parse({"servers": "nats://127.0.0.1:4222", "stream": "S", "decode": "json",
                                                 "json_mode": "permissive"}))
    batch = lenient.batch([("orders.eu", 41, 0, None, b'{"n": 1}'), ("orders.eu", 42, 0, None, payload)])
    assert batch.column(0).to_pylist() == [1, None]
    assert batch.column(1).to_pylist() == [None, payload.decode("utf-8", "replace")]


def test_json_rows_written_with_rfc3339_times_exact_decimals_and_base64() -> None:
    from datetime import UTC, date, datetime
    from decimal import Decimal

    import pyarrow as pa

    from airflow_jetstream.spark.json_rows import encode_rows

    batch = pa.RecordBatch.from_pydict({
        "ts": pa.array([datetime(2026, 1, 1, 12, tzinfo=UTC)], pa.timestamp("us", tz="UTC")),
        "day": pa.array([date(2026, 1, 2)]), "dec": pa.array([Decimal("12.30")]), "bin": pa.array([b"\x00\xff"]),
        "m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())), "n": pa.array([None], pa.int64()),
    })
    assert json.loads(encode_rows(batch, batch.schema.names)[0]) == {
        "ts": "2026-01-01T12:00:00Z", "day": "2026-01-02", "dec": "12.30", "bin": "AP8=", "m": {"k": 1}, "n": None}
    nan = pa.RecordBatch.from_pydict({"x": pa.array([float("nan")])})
    with pytest.raises(InvalidRequestError) as err:
        encode_rows(nan, ["x"])
    assert err.value.reason == "invalid_value" and "'x'" in err.value.message


def test_publish_operator_sends_a_list_header_as_a_repeated_header() -> None:
    from airflow_jetstream.client.batches.wire import encode_header_lines
    from airflow_jetstream.operators.publish import to_batch_message

    msg = to_batch_message({"subject": "a.b", "data": {"k": 1}, "headers": {"X-Tag": ["a", "b"], "X-N": 1}},
                           0, None, None)
    assert msg.headers == {"X-Tag": ["a", "b"], "X-N": "1"} and msg.data == b'{"k":1}'
    assert encode_header_lines(msg.headers) == b"X-Tag: a\r\nX-Tag: b\r\nX-N: 1\r\n"
