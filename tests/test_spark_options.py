"""Option parsing and the pure helpers of the Spark data source (no Spark session, no server)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from airflow_jetstream.client.errors import InvalidRequestError, InvalidSubjectError
from airflow_jetstream.client.reading.headers import parse_header_lines
from airflow_jetstream.client.reading.read_plan import split_range
from airflow_jetstream.spark.options import ReadOptions, WriteOptions
from airflow_jetstream.spark.writer import chunk_id, message_id

SERVER = {"servers": "nats://127.0.0.1:4222"}


def test_write_options_defaults_and_case_insensitive_keys() -> None:
    opts = WriteOptions.parse({**SERVER, "STREAM": "ORDERS", "Job_Id": "orders-1"})
    assert (opts.stream, opts.mode, opts.job_id, opts.run_id) == ("ORDERS", "atomic", "orders-1", "orders-1")
    # 999 rows and the fence of the chunk: the server's max_msgs of 1000
    assert opts.job_id_given and opts.batch_size == 999 and opts.ledger_bucket == "batch_ledger"
    assert opts.settings.servers == ("nats://127.0.0.1:4222",)


def test_write_options_generate_a_job_id_and_can_disable_the_ledger() -> None:
    opts = WriteOptions.parse({**SERVER, "stream": "ORDERS", "ledger_bucket": "none", "mode": "FAST"})
    assert not opts.job_id_given and len(opts.job_id) == 32
    assert opts.ledger_bucket is None and opts.mode == "fast"


@pytest.mark.parametrize(("options", "reason", "fragment"), [
    ({"stream": "S", "numpartitions": "4"}, "unknown_option", "numpartitions"),
    ({"stream": "S", "mode": "quick"}, "invalid_option", "atomic, fast"),
    ({"stream": "S", "batch_size": "0"}, "invalid_option", "batch_size"),
    ({"stream": "S", "batch_size": "many"}, "invalid_option", "integer"),
    ({"stream": "S", "job_id": "has space"}, "invalid_option", "job_id"),
    ({"stream": "S", "job_id": "x" * 41}, "invalid_option", "1-40"),
    ({}, "missing_option", "stream"),
])
def test_write_options_refuse_bad_input(options: dict[str, str], reason: str, fragment: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        WriteOptions.parse({**SERVER, **options})
    assert err.value.reason == reason
    assert fragment in str(err.value)


def test_write_options_need_servers_and_valid_subject() -> None:
    with pytest.raises(InvalidRequestError, match="servers") as err:
        WriteOptions.parse({"stream": "S"})
    assert err.value.reason == "missing_option"
    with pytest.raises(InvalidSubjectError):
        WriteOptions.parse({**SERVER, "stream": "S", "subject": "orders.*"})


def test_read_options() -> None:
    opts = ReadOptions.parse({**SERVER, "path": "ORDERS", "filter_subjects": "orders.eu, orders.us",
                              "start_seq": "10", "num_partitions": "3", "decode": "UTF8", "consume": "yes"})
    assert opts.stream == "ORDERS" and opts.filter_subjects == ("orders.eu", "orders.us")
    assert (opts.start_seq, opts.num_partitions, opts.decode, opts.consume) == (10, 3, "utf-8", True)
    with pytest.raises(InvalidRequestError, match="either start_seq or start_time"):
        ReadOptions.parse({**SERVER, "stream": "S", "start_seq": "1", "start_time": "2026-01-01T00:00:00Z"})
    with pytest.raises(InvalidRequestError, match="ISO 8601"):
        ReadOptions.parse({**SERVER, "stream": "S", "start_time": "yesterday"})
    with pytest.raises(InvalidRequestError, match="true or false"):
        ReadOptions.parse({**SERVER, "stream": "S", "consume": "maybe"})
    with pytest.raises(InvalidRequestError) as err:
        ReadOptions.parse({**SERVER, "stream": "S", "mode": "atomic"})
    assert err.value.reason == "unknown_option"


def test_secrets_in_options_stay_out_of_repr() -> None:
    opts = ReadOptions.parse({**SERVER, "stream": "S", "user": "app", "password": "hunter2-secret"})
    assert opts.settings.password == "hunter2-secret"
    assert "hunter2-secret" not in repr(opts)


def test_split_range_is_contiguous_and_balanced() -> None:
    assert split_range(1, 10, 3) == ((1, 4), (5, 7), (8, 10))
    assert split_range(5, 6, 4) == ((5, 5), (6, 6))
    assert split_range(3, 2, 4) == ()
    parts = split_range(101, 200_100, 7)
    assert parts[0][0] == 101 and parts[-1][1] == 200_100
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(parts))


def test_header_parser_matches_nats_py() -> None:
    from nats.aio.client import Client

    raw = (b"Nats-Msg-Id: j-0-1\r\nX-Trace:  abc \r\n Lead : y\r\nDup: 1\r\nDup: 2\r\nBad Name: x\r\n"
           b"Unicode: caf\xc3\xa9\r\nnocolon\r\n\r\n")
    assert parse_header_lines(raw) == Client._parse_header_lines(raw)
    assert parse_header_lines(raw)["Unicode"] == "café"


def test_ids_are_deterministic() -> None:
    assert message_id("job", 3, 17) == "job-3-17"
    assert chunk_id("job", 3, 0) == "job-3-0"


def test_json_decoding_errors_are_typed() -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    from airflow_jetstream.spark.reader import _Columns

    options = ReadOptions.parse({"servers": "nats://127.0.0.1:4222", "stream": "S", "decode": "json"})
    columns = _Columns(StructType([StructField("seq", LongType()), StructField("n", LongType())]), options)
    batch = columns.batch([("a", 1, 0, None, b'{"n": 5}'), ("a", 2, 0, None, b'{"m": 1}')])
    assert batch.column(1).to_pylist() == [5, None]
    with pytest.raises(InvalidRequestError) as err:
        columns.batch([("a", 3, 0, None, b"not json")])
    assert err.value.reason == "invalid_json" and "message 3" in str(err.value)
    with pytest.raises(InvalidRequestError) as err:
        columns.batch([("a", 4, 0, None, b'{"n": "x"}')])
    assert err.value.reason == "invalid_json" and "column 'n'" in str(err.value)


def test_stream_read_options() -> None:
    opts = ReadOptions.parse({**SERVER, "stream": "ORDERS", "start": "NEW", "max_messages_per_trigger": "500",
                              "max_bytes_per_trigger": "1048576", "num_partitions": "2"}, streaming=True)
    assert (opts.start, opts.max_messages_per_trigger, opts.max_bytes_per_trigger) == ("new", 500, 1048576)
    assert opts.stream == "ORDERS" and opts.num_partitions == 2
    assert ReadOptions.parse({**SERVER, "stream": "S"}, streaming=True).start == "first"
    bounded = ReadOptions.parse({**SERVER, "stream": "S", "end_time": "2026-01-31T12:00:00Z", "start_seq": "5"},
                                streaming=True)
    assert (bounded.end_time, bounded.start_seq, bounded.end_seq) == ("2026-01-31T12:00:00Z", 5, None)
    assert ReadOptions.parse({**SERVER, "stream": "S", "start": "2026-01-31T12:00:00Z"},
                             streaming=True).start.startswith("2026")
    for bad, fragment in [({"start": "new", "start_seq": "3"}, "one start position"),
                          ({"start": "soon"}, "ISO 8601"),
                          ({"worker_subjects": "a.>;b.>"}, "batch read"),
                          ({"end_seq": "10", "end_time": "2026-01-31T12:00:00Z"}, "end_seq or end_time"),
                          ({"end_time": "tomorrow"}, "ISO 8601"),
                          ({"max_messages_per_trigger": "0"}, "max_messages_per_trigger"),
                          ({"maxoffsetspertrigger": "10"}, "unknown streaming read option")]:
        with pytest.raises(InvalidRequestError, match=fragment):
            ReadOptions.parse({**SERVER, "stream": "S", **bad}, streaming=True)


def test_streaming_features_missing_from_older_pyspark_are_refused_naming_the_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_jetstream.spark import reader, writer

    limited = ReadOptions.parse({**SERVER, "stream": "S", "max_bytes_per_trigger": "1000"}, streaming=True)
    reader.check_streaming_read_support(limited, "4.2.0")
    monkeypatch.setattr(reader, "READ_LIMITS", False)
    reader.check_streaming_read_support(ReadOptions.parse({**SERVER, "stream": "S"}, streaming=True), "4.1.1")
    with pytest.raises(InvalidRequestError, match=r"need pyspark 4\.2 or later.*this is pyspark 4\.1\.1") as err:
        reader.check_streaming_read_support(limited, "4.1.1")
    assert err.value.reason == "pyspark_too_old" and "max_bytes_per_trigger" in str(err.value)

    with pytest.raises(InvalidRequestError, match="query id"):
        writer.check_streaming_write_support({"job_id": "mine"}, "4.2.0")
    monkeypatch.setattr(writer, "ARROW_STREAM_WRITER", False)
    with pytest.raises(InvalidRequestError, match=r"needs pyspark 4\.1 or later.*this is pyspark 4\.0\.0"):
        writer.check_streaming_write_support({}, "4.0.0")
    assert writer.micro_batch_job_id("0b6f1c2e-aaaa-bbbb-cccc-0123456789ab", 7) == \
        "0b6f1c2eaaaabbbbcccc0123456789ab-7"


def test_the_driver_reads_the_query_id_from_a_local_checkpoint_only(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from airflow_jetstream.spark.writer import checkpoint_query_id

    checkpoint = tmp_path / "check point"
    checkpoint.mkdir()
    assert checkpoint_query_id(str(checkpoint)) is None  # no metadata file yet
    (checkpoint / "metadata").write_text('{"id":"0b6f1c2e-aaaa-bbbb-cccc-0123456789ab"}\n')
    assert checkpoint_query_id(str(checkpoint)) == "0b6f1c2e-aaaa-bbbb-cccc-0123456789ab"
    assert checkpoint_query_id(checkpoint.as_uri()) == "0b6f1c2e-aaaa-bbbb-cccc-0123456789ab"
    # other file systems and relative paths (resolved by the JVM, not here): no query id
    for location in ("hdfs://nn:8020/checkpoints/q", "s3a://bucket/q", "check point", "", None):
        assert checkpoint_query_id(location) is None
    (checkpoint / "metadata").write_text("not json\n")
    assert checkpoint_query_id(str(checkpoint)) is None


def test_bulk_writes_use_the_fast_batch_default_flow() -> None:
    """One default for one setting: the writer's bulk mode asks the server for flow acks as rarely as
    the client's fast batch does (it used 500, half of it: twice the acks, 0.76x a bare fast batch)."""
    from airflow_jetstream.client.batches.fast import DEFAULT_FLOW

    options = WriteOptions.parse({"servers": "nats://127.0.0.1:4222", "stream": "S", "mode": "fast"})
    assert options.flow == DEFAULT_FLOW == 1000
    assert WriteOptions.parse({"servers": "nats://127.0.0.1:4222", "stream": "S", "flow": "200"}).flow == 200


def test_the_default_schema_reads_decode_as_the_reader_does() -> None:
    """decode=UTF8 is utf-8 for the reader, so the schema of a read without a user schema has a string payload
    too (it had a binary one, which the reader then refused: invalid_schema)."""
    pytest.importorskip("pyspark")
    from airflow_jetstream.spark import JetStreamDataSource

    assert JetStreamDataSource({"decode": "UTF8"}).schema().endswith("payload string")
    assert JetStreamDataSource({"Decode": "json"}).schema().endswith("payload string")
    assert JetStreamDataSource({}).schema().endswith("payload binary")
