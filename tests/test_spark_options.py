"""Option parsing and the pure helpers of the Spark data source (no Spark session, no server)."""

from __future__ import annotations

import itertools

import pytest

from airflow_jetstream.client.errors import InvalidRequestError, InvalidSubjectError
from airflow_jetstream.client.reading.headers import parse_header_lines
from airflow_jetstream.client.reading.range_read import split_range
from airflow_jetstream.spark.options import ReadOptions, WriteOptions
from airflow_jetstream.spark.writer import chunk_id, message_id

SERVER = {"servers": "nats://127.0.0.1:4222"}


def test_write_options_defaults_and_case_insensitive_keys() -> None:
    opts = WriteOptions.parse({**SERVER, "STREAM": "ORDERS", "Job_Id": "orders-1"})
    assert (opts.stream, opts.mode, opts.job_id, opts.run_id) == ("ORDERS", "atomic", "orders-1", "orders-1")
    assert opts.job_id_given and opts.batch_size == 1000 and opts.ledger_bucket == "batch_ledger"
    assert opts.settings.servers == ("nats://127.0.0.1:4222",)


def test_write_options_generate_a_job_id_and_can_disable_the_ledger() -> None:
    opts = WriteOptions.parse({**SERVER, "stream": "ORDERS", "ledger_bucket": "none", "mode": "BULK"})
    assert not opts.job_id_given and len(opts.job_id) == 32
    assert opts.ledger_bucket is None and opts.mode == "bulk"


@pytest.mark.parametrize(("options", "reason", "fragment"), [
    ({"stream": "S", "numpartitions": "4"}, "unknown_option", "numpartitions"),
    ({"stream": "S", "mode": "fast"}, "invalid_option", "atomic, bulk"),
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
    opts = ReadOptions.parse({**SERVER, "path": "ORDERS", "subjects": "orders.eu, orders.us",
                              "start_seq": "10", "num_partitions": "3", "decode": "UTF8", "consume": "yes"})
    assert opts.stream == "ORDERS" and opts.subjects == ("orders.eu", "orders.us")
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
