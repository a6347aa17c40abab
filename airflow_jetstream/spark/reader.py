"""The read side of the ``jetstream`` data source: bounded, parallel batch reads (docs/spark.md) and the streaming
read, ``spark.readStream.format("jetstream")`` (docs/streaming.md).

A batch read's end is fixed once, when Spark plans the job, and ``first..last`` is split into sequence ranges read
in parallel, so every action sees the same messages. Reading never removes anything;
:func:`airflow_jetstream.spark.consume` acknowledges exactly what was read, and only after the caller's block (the
output's write) succeeded.

Streaming offsets are stream sequences (``{"stream": "ORDERS", "seq": n}``: Spark has every message up to ``n``);
a micro-batch from ``a`` to ``b`` reads ``a+1..b`` with the batch read's planning and columns. Spark writes a
micro-batch's offsets to the checkpoint before it runs and a commit after the sink finished, so every
message is read exactly once per checkpoint. Read limits need pyspark 4.2 (``max_bytes_per_trigger`` is
soft: turned into sequences with the stream's average message size); ``end_seq``/``end_time`` bound every
micro-batch. With ``consume=true`` a micro-batch is acknowledged when Spark commits its end offset, which
it does only after the micro-batch's commit is in the checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import BinaryType, StringType, StructType

from airflow_jetstream.client.admin.streams import first_seq_at_or_after, stream_info
from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.reading.headers import header_values
from airflow_jetstream.client.reading.messages import Row, is_utf8
from airflow_jetstream.client.reading.read_plan import (
    ReadPlan,
    acknowledge_read,
    plan_read,
    plan_worker_read,
    read_method,
    resolve_start,
    split_range,
)
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.spark.driver import progress, run
from airflow_jetstream.spark.json_rows import BadValue, converter, headers_kind, parse_payload
from airflow_jetstream.spark.options import ReadOptions

try:  # pyspark 4.2+: read limits (admission control) and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pyspark 4.0 / 4.1
    READ_LIMITS = False
    _STREAM_BASES: tuple[type, ...] = (DataSourceStreamReader,)
else:
    READ_LIMITS = True
    _STREAM_BASES = (DataSourceStreamReader, SupportsTriggerAvailableNow)

log = logging.getLogger(__name__)

#: Columns filled from the message metadata; any other column of a user schema comes from the JSON payload.
METADATA_COLUMNS = ("subject", "seq", "timestamp", "headers", "payload")
#: Rows per partition the default partitioning aims at.
ROWS_PER_PARTITION = 100_000
MAX_DEFAULT_PARTITIONS = 64


def default_schema(decode: str) -> str:
    """The schema of a read without a user schema."""
    payload = "binary" if decode == "none" else "string"
    return f"subject string, seq long, timestamp timestamp, headers map<string,string>, payload {payload}"


async def plan_for(conn: JetStreamConnection, options: ReadOptions) -> ReadPlan:
    """Fix the bounds of a read now (the driver does this once per job)."""
    plan = await plan_read(conn, options.stream, subjects=options.filter_subjects, start_seq=options.start_seq,
                           start_time=options.start_time, end_seq=options.end_seq, consumer=options.consumer)
    span = plan.last_seq - plan.first_seq + 1
    parts = options.num_partitions or max(1, min(MAX_DEFAULT_PARTITIONS, -(-span // ROWS_PER_PARTITION)))
    plan = dataclasses.replace(plan, ranges=split_range(plan.first_seq, plan.last_seq, parts))
    if options.worker_subjects:
        plan = await plan_worker_read(conn, plan, options.worker_subjects, prefix=options.worker_prefix)
    read_method(plan, consume=options.consume)
    return plan


class _Columns:
    """Builds one Arrow record batch per chunk of stored messages, for the requested schema; built on the driver,
    it refuses a schema the reader cannot fill before any task starts."""

    def __init__(self, schema: StructType, options: ReadOptions) -> None:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_type

        self.decode, self.corrupt = options.decode, options.corrupt_record_column
        self.permissive = options.json_mode == "permissive"
        extra = [f for f in schema.fields if f.name not in METADATA_COLUMNS and f.name != self.corrupt]
        if extra and options.decode != "json":
            raise InvalidRequestError(
                f"schema column(s) {', '.join(f.name for f in extra)} are not message fields "
                f"({', '.join(METADATA_COLUMNS)}); set .option('decode', 'json') to fill them from the JSON payload",
                reason="invalid_schema",
            )
        self.json_fields = [(f.name, converter(f.dataType)) for f in extra]
        self.all_header_values = False
        for f in schema.fields:
            if f.name == self.corrupt and not isinstance(f.dataType, StringType):
                raise InvalidRequestError(f"column {f.name} (the corrupt record column) must be a string",
                                          reason="invalid_schema")
            if f.name == "headers":
                self.all_header_values = headers_kind(f.dataType, f.name, "invalid_schema") == "all"
            wanted = BinaryType if options.decode == "none" else StringType
            if f.name == "payload" and not isinstance(f.dataType, wanted):
                raise InvalidRequestError(f"column payload must be {wanted().simpleString()} with "
                                          f"decode={options.decode}", reason="invalid_schema")
        # pyspark 4.2 takes the time zone; 4.0 and 4.1 make timestamps UTC by default (timestamp_utc=True).
        arrow_type: Any = to_arrow_type
        utc: dict[str, Any] = {"timezone": "UTC"} if "timezone" in inspect.signature(arrow_type).parameters else {}
        self.arrow_schema = pa.schema([pa.field(f.name, arrow_type(f.dataType, **utc), nullable=True)
                                       for f in schema.fields])

    def _decode(self, chunk: list[Row]) -> tuple[dict[str, list[Any]], list[str | None]]:
        """The JSON columns' values and the corrupt records (raw payloads of bad messages, permissive mode)."""
        columns: dict[str, list[Any]] = {name: [] for name, _ in self.json_fields}
        corrupt: list[str | None] = []
        for subject, seq, _, _, payload in chunk:
            row: dict[str, Any] = {}
            column = None
            bad = None
            try:
                body = parse_payload(payload)
                for column, convert in self.json_fields:
                    row[column] = convert(body.get(column))
            except BadValue as exc:
                if not self.permissive:
                    raise InvalidRequestError(
                        f"message {seq} ({subject}): {f'column {column!r}: ' if column else ''}{exc}. Fix the "
                        "producer, filter the message out with subjects, change the schema's type, or read with "
                        "json_mode=permissive (bad rows get nulls and their payload in the corrupt record column)",
                        reason="invalid_json",
                    ) from None
                bad = bytes(payload).decode("utf-8", "replace")
            for name, _ in self.json_fields:
                columns[name].append(None if bad is not None else row[name])
            corrupt.append(bad)
        return columns, corrupt

    @staticmethod
    def _texts(chunk: list[Row]) -> list[str]:
        try:
            return [bytes(m[4]).decode("utf-8") for m in chunk]
        except UnicodeDecodeError:
            seq, subject = next((m[1], m[0]) for m in chunk if not is_utf8(bytes(m[4])))
            raise InvalidRequestError(f"message {seq} ({subject}): the payload is not UTF-8, so it cannot fill "
                                      "the string payload column; read it with decode=none (binary)",
                                      reason="invalid_utf8") from None

    def _headers(self, headers: Any) -> Any:
        if not headers:
            return None
        values = header_values(headers)
        if self.all_header_values:
            return list(values.items())
        return [(name, ", ".join(items)) for name, items in values.items()]

    def batch(self, chunk: list[Row]) -> Any:
        import pyarrow as pa

        decoded, corrupt = self._decode(chunk) if self.json_fields else ({}, [None] * len(chunk))
        columns: dict[str, Callable[[], list[Any]]] = {
            self.corrupt: lambda: corrupt,
            "subject": lambda: [m[0] for m in chunk],
            "seq": lambda: [m[1] for m in chunk],
            "timestamp": lambda: [m[2] // 1000 for m in chunk],
            "headers": lambda: [self._headers(m[3]) for m in chunk],
            "payload": lambda: [m[4] for m in chunk] if self.decode == "none" else self._texts(chunk),
        }
        arrays = []
        for field in self.arrow_schema:
            name = field.name
            values = columns[name]() if name in columns else decoded[name]
            try:
                arrays.append(pa.array(values, type=field.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise InvalidRequestError(
                    f"column {name!r} ({field.type}) cannot hold the values of messages {chunk[0][1]}..{chunk[-1][1]}: "
                    f"{exc}; fix the schema's type for it",
                    reason="invalid_schema",
                ) from None
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


class _PartitionReader:
    """What the batch and the streaming reader share: the checked schema's columns and the tasks' side, reading
    partitions ``(via, first, last, subjects)`` of a plan (:func:`plan_partitions`)."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options, self.columns = options, _Columns(schema, options)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """One task's share of a read: Arrow record batches of the stream's messages ``first..last``."""
        via, first, last, subjects = partition.value
        if last < first:
            return
        options = self.options

        async def chunks() -> AsyncGenerator[list[Row], None]:
            async with open_connection(options.settings) as conn:
                async for chunk in read_range(conn, options.stream, first, last, subjects=tuple(subjects), via=via,
                                              batch=options.batch_size):
                    yield chunk

        async def next_chunk() -> list[Row] | None:
            return await anext(agen, None)

        # a private loop, driven from this synchronous generator; closing it closes the connection (asyncgens)
        with asyncio.Runner() as runner:
            agen = chunks()
            while (chunk := runner.run(next_chunk())) is not None:
                yield self.columns.batch(chunk)


def plan_partitions(plan: ReadPlan, *, consume: bool) -> list[InputPartition]:
    """The plan's partitions as the tasks read them: how (direct gets or a consumer), sequences and subjects."""
    via = read_method(plan, consume=consume)
    return [InputPartition((via, first, last, subjects)) for first, last, subjects in plan.partitions()]


class JetStreamReader(_PartitionReader, DataSourceReader):
    """Plans on the driver (bounds fixed once), reads sequence ranges in the tasks."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self.plan = run(options.settings, plan_for, options)
        log.info("jetstream read of %s: seq %d..%d in %d partition(s) via %s", self.plan.stream,
                 self.plan.first_seq, self.plan.last_seq, len(self.plan.partitions()),
                 read_method(self.plan, consume=options.consume))

    def partitions(self) -> list[InputPartition]:
        return plan_partitions(self.plan, consume=self.options.consume) or [InputPartition(("direct", 1, 0, ()))]


def check_streaming_read_support(options: ReadOptions, pyspark_version: str) -> None:
    """Refuse read limits on a pyspark without them (they arrived in 4.2), naming the version."""
    if READ_LIMITS:
        return
    given = [name for name in ("max_messages_per_trigger", "max_bytes_per_trigger") if getattr(options, name)]
    if given:
        raise InvalidRequestError(
            f"option(s) {', '.join(given)} need pyspark 4.2 or later (read limits for Python data sources); "
            f"this is pyspark {pyspark_version}: upgrade pyspark or leave them unset (each micro-batch then "
            "reads everything stored since the previous one)",
            reason="pyspark_too_old",
        )


def _offset(stream: str, seq: int) -> dict[str, Any]:
    return {"stream": stream, "seq": seq}


def _seq(offset: dict[str, Any], stream: str) -> int:
    """The sequence of an offset of this stream (a checkpoint of another stream is refused)."""
    if offset.get("stream") != stream:
        raise InvalidRequestError(
            f"the query's checkpoint holds offsets of stream {offset.get('stream')!r}, not {stream!r}; "
            "give each query its own checkpoint location",
            reason="invalid_checkpoint",
        )
    return int(offset["seq"])


async def _start_seq(conn: JetStreamConnection, read: ReadOptions) -> int:
    """The first sequence a new query reads (after the cursor consumer's ack floor, when there is one)."""
    start_seq = read.start_seq
    if start_seq is None and read.start_time is None:
        start_seq = await resolve_start(conn, read.stream, read.start)
    plan = await plan_read(conn, read.stream, subjects=read.filter_subjects, start_seq=start_seq,
                           start_time=read.start_time, consumer=read.consumer)
    return plan.first_seq


async def _stream_state(conn: JetStreamConnection, read: ReadOptions) -> tuple[dict[str, Any], int]:
    """The stream's state and the last sequence the query may read (``end_seq``/``end_time`` applied)."""
    state = (await stream_info(conn, read.stream))["state"]
    last = int(state.get("last_seq") or 0)
    if read.end_seq is not None:
        last = min(last, read.end_seq)
    if read.end_time is not None:
        last = min(last, await first_seq_at_or_after(conn, read.stream, read.end_time) - 1)
    return state, last


async def _acknowledge(conn: JetStreamConnection, read: ReadOptions, last: int) -> int:
    plan = await plan_read(conn, read.stream, subjects=read.filter_subjects, end_seq=last, consumer=read.consumer)
    return await acknowledge_read(conn, plan)


class JetStreamStreamReader(_PartitionReader, *_STREAM_BASES):  # type: ignore[misc]
    """The driver side keeps the query's latest sequence and, under AvailableNow, its target."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self.stream = options.stream
        #: Trigger.AvailableNow: the last sequence stored when the query started.
        self.target: int | None = None
        #: The stream's last sequence at the latest planning (the progress's ``latestOffset``).
        self.latest: int | None = None
        #: A new query's start, resolved once (Spark asks for it more than once as the query starts).
        self.initial: dict[str, Any] | None = None

    def initialOffset(self) -> dict[str, Any]:
        if self.initial is None:
            first = run(self.options.settings, _start_seq, self.options)
            progress(f"stream read of {self.stream}: a new query starts at seq {first} (start={self.options.start})")
            self.initial = _offset(self.stream, first - 1)
        return self.initial

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        """The end of the next micro-batch: the stream's last sequence (at most the AvailableNow target),
        capped by the read limit. pyspark 4.0/4.1 call it without arguments (no read limits there)."""
        state, end = run(self.options.settings, _stream_state, self.options)
        self.latest = int(state.get("last_seq") or 0)
        end = end if self.target is None else min(end, self.target)
        if start is None:
            return _offset(self.stream, end)
        begin = _seq(start, self.stream)
        if limit is not None and not isinstance(limit, ReadAllAvailable):
            end = min(end, begin + self._span(limit, state))
        return _offset(self.stream, max(begin, end))

    def _span(self, limit: ReadLimit, state: dict[str, Any]) -> int:
        """How many sequences one micro-batch may span under ``limit`` and the options' limits."""
        max_messages = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_messages_per_trigger
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.options.max_bytes_per_trigger
        spans = [max_messages] if max_messages else []
        if max_bytes:
            average = max(1, int(state.get("bytes") or 0) // max(1, int(state.get("messages") or 0)))
            spans.append(max(1, max_bytes // average))
        return min(spans, default=int(state.get("last_seq") or 0))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        if self.options.max_bytes_per_trigger:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self.latest is None else _offset(self.stream, self.latest)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = run(self.options.settings, _stream_state, self.options)[1]
        progress(f"stream read of {self.stream}: Trigger.AvailableNow reads up to seq {self.target}")

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        first, last = _seq(start, self.stream) + 1, _seq(end, self.stream)
        if last < first:
            return []
        read = dataclasses.replace(self.options, start_seq=first, start_time=None, end_seq=last)
        plan = run(read.settings, plan_for, read)
        if plan.first_seq > first:
            log.warning("stream %s: seq %d..%d were removed (limits, max age or a purge) before this query read "
                        "them", self.stream, first, plan.first_seq - 1)
        return plan_partitions(plan, consume=read.consume)

    def commit(self, end: dict[str, Any]) -> None:
        if not self.options.consume:
            return
        last = _seq(end, self.stream)
        removed = run(self.options.settings, _acknowledge, self.options, last)
        progress(f"stream read of {self.stream}: acknowledged up to seq {last} ({removed} message(s) removed)")
