"""The read side of the ``jetstream`` data source: a bounded, parallel read of a stream (docs/spark.md).

The end is fixed once, when Spark plans the job, and ``first..last`` is split into sequence ranges read in
parallel, so every action sees the same messages. Reading never removes anything; :func:`consume`
acknowledges exactly what was read, and only after the caller's block (the output's write) succeeded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import BinaryType, StringType, StructType

from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.records import BatchRecord
from airflow_jetstream.client.reading.headers import header_values
from airflow_jetstream.client.reading.messages import Row, is_utf8
from airflow_jetstream.client.reading.read_plan import (
    ReadPlan,
    acknowledge_read,
    plan_read,
    plan_worker_read,
    read_method,
)
from airflow_jetstream.client.reading.stored import read_range
from airflow_jetstream.spark.connection import session_connection_fields, with_connection_defaults
from airflow_jetstream.spark.json_rows import BadValue, bad_json_error, converter, headers_kind, parse_payload
from airflow_jetstream.spark.options import ReadOptions, lowered
from airflow_jetstream.spark.progress import progress, rate

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


def check_read_schema(schema: StructType, options: ReadOptions) -> None:
    """Refuse a user schema the reader cannot fill."""
    extra = [f.name for f in schema.fields
             if f.name not in METADATA_COLUMNS and f.name != options.corrupt_record_column]
    if extra and options.decode != "json":
        raise InvalidRequestError(
            f"schema column(s) {', '.join(extra)} are not message fields ({', '.join(METADATA_COLUMNS)}); "
            "set .option('decode', 'json') to fill them from the JSON payload",
            reason="invalid_schema",
        )
    for f in schema.fields:
        if f.name == options.corrupt_record_column and not isinstance(f.dataType, StringType):
            raise InvalidRequestError(f"column {f.name} (the corrupt record column) must be a string",
                                      reason="invalid_schema")
        if f.name == "headers" and not headers_kind(f.dataType):
            raise InvalidRequestError(
                f"column headers must be map<string,string> (a repeated name's values joined by ', ') or "
                f"map<string,array<string>> (every value), not {f.dataType.simpleString()}",
                reason="invalid_schema",
            )
        if f.name == "payload":
            wanted = BinaryType if options.decode == "none" else StringType
            if not isinstance(f.dataType, wanted):
                raise InvalidRequestError(
                    f"column payload must be {wanted().simpleString()} with decode={options.decode}",
                    reason="invalid_schema",
                )


async def plan_for(options: ReadOptions) -> ReadPlan:
    """Fix the bounds of a read now (the driver does this once per job)."""
    async with open_connection(options.settings) as conn:
        plan = await plan_read(conn, options.stream, subjects=options.filter_subjects, start_seq=options.start_seq,
                               start_time=options.start_time, end_seq=options.end_seq, partitions=1,
                               consumer=options.consumer)
        span = plan.last_seq - plan.first_seq + 1
        parts = options.num_partitions or max(1, min(MAX_DEFAULT_PARTITIONS, -(-span // ROWS_PER_PARTITION)))
        plan = await plan_read(conn, options.stream, subjects=plan.subjects, start_seq=plan.first_seq,
                               end_seq=plan.last_seq, partitions=parts)
        plan = dataclasses.replace(plan, consumer=options.consumer)
        if options.worker_subjects:
            plan = await plan_worker_read(conn, plan, options.worker_subjects, prefix=options.worker_prefix)
    read_method(plan, consume=options.consume)
    return plan


class _Columns:
    """Builds one Arrow record batch per chunk of stored messages, for the requested schema."""

    def __init__(self, schema: StructType, options: ReadOptions) -> None:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_type

        self.pa = pa
        self.schema = schema
        self.decode = options.decode
        self.permissive = options.json_mode == "permissive"
        self.corrupt = options.corrupt_record_column
        # pyspark 4.2 takes the time zone; 4.0 and 4.1 make timestamps UTC by default (timestamp_utc=True).
        arrow_type: Any = to_arrow_type
        utc: dict[str, Any] = {"timezone": "UTC"} if "timezone" in inspect.signature(arrow_type).parameters else {}
        self.arrow_schema = pa.schema([pa.field(f.name, arrow_type(f.dataType, **utc), nullable=True)
                                       for f in schema.fields])
        self.json_fields = [(f.name, converter(f.dataType)) for f in schema.fields
                            if f.name not in METADATA_COLUMNS and f.name != self.corrupt]
        headers = next((f for f in schema.fields if f.name == "headers"), None)
        self.all_header_values = headers is not None and headers_kind(headers.dataType) == "all"

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
                    raise bad_json_error(seq, subject, str(exc), column) from None
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
        pa = self.pa
        decoded, corrupt = self._decode(chunk) if self.json_fields else ({}, [None] * len(chunk))
        arrays = []
        for field in self.arrow_schema:
            name = field.name
            if name == "subject":
                values: list[Any] = [m[0] for m in chunk]
            elif name == "seq":
                values = [m[1] for m in chunk]
            elif name == "timestamp":
                values = [m[2] // 1000 for m in chunk]
            elif name == "headers":
                values = [self._headers(m[3]) for m in chunk]
            elif name == "payload":
                values = [m[4] for m in chunk] if self.decode == "none" else self._texts(chunk)
            elif name == self.corrupt:
                values = corrupt
            else:
                values = decoded[name]
            try:
                arrays.append(pa.array(values, type=field.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise InvalidRequestError(
                    f"column {name!r} ({field.type}) cannot hold the values of messages {chunk[0][1]}..{chunk[-1][1]}: "
                    f"{exc}; fix the schema's type for it",
                    reason="invalid_schema",
                ) from None
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


class JetStreamReader(DataSourceReader):
    """Plans on the driver (bounds fixed once), reads sequence ranges in the tasks."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        check_read_schema(schema, options)
        self.options = options
        self.schema = schema
        self.plan = asyncio.run(plan_for(options))
        self.via = read_method(self.plan, consume=options.consume)
        log.info("jetstream read of %s: seq %d..%d in %d partition(s) via %s", self.plan.stream,
                 self.plan.first_seq, self.plan.last_seq, len(self.plan.partitions()), self.via)

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(p) for p in self.plan.partitions()] or [InputPartition((1, 0, ()))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        first, last, subjects = partition.value
        yield from read_batches(self.options, self.schema, self.plan.stream, self.via, first, last, subjects)


def read_batches(options: ReadOptions, schema: StructType, stream: str, via: str, first: int, last: int,
                 subjects: Sequence[str]) -> Iterator[Any]:
    """One task's share of a read: Arrow record batches of ``stream``'s messages ``first..last``."""
    if last < first:
        return
    columns = _Columns(schema, options)

    async def chunks() -> AsyncGenerator[list[Row], None]:
        async with open_connection(options.settings) as conn:
            async for chunk in read_range(conn, stream, first, last, subjects=tuple(subjects), via=via,
                                          batch=options.batch_size):
                yield chunk

    loop = asyncio.new_event_loop()  # a private loop, driven from this synchronous generator
    agen = chunks()
    try:
        while True:
            try:
                chunk = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
            yield columns.batch(chunk)
    finally:
        loop.run_until_complete(agen.aclose())
        loop.close()


@dataclasses.dataclass
class Consumption:
    """What a :func:`consume` block covers; ``removed`` is set once the read was acknowledged."""

    plan: ReadPlan
    claimed: list[BatchRecord]
    removed: int | None = None
    #: The ledger said every batch of the run was consumed before this block: an earlier attempt consumed the run
    #: (one whose success its scheduler never heard, say), so this one claimed nothing and must leave that
    #: attempt's output as it is, not replace it with its own read (which the earlier acknowledgement emptied).
    already_consumed: bool = False

    @property
    def claim_revisions(self) -> dict[str, int]:
        """Each claimed batch's fencing token: the ledger revision its claim was written at (a later claim of the
        batch has a higher one). Store it with the output so readers can trust the latest claim's only."""
        return {b.batch_id: b.revision for b in self.claimed}

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "claimed_batches": [b.batch_id for b in self.claimed],
                "claim_revisions": self.claim_revisions, "already_consumed": self.already_consumed,
                "removed": self.removed}


async def _claim(options: ReadOptions, run_id: str | None, ledger_bucket: str, owner: str,
                 visibility_timeout: float | str | timedelta) -> tuple[list[BatchRecord], bool]:
    """The claims taken on the run's batches, and whether the ledger says the run was consumed before."""
    if not run_id:
        return [], False
    async with open_connection(options.settings) as conn:
        ledger = await BatchLedger.open(conn, ledger_bucket, visibility_timeout=visibility_timeout)
        return await ledger.claim_run(run_id, owner=owner)


async def _finish(options: ReadOptions, consumption: Consumption, ledger_bucket: str, error: str | None) -> None:
    """Settle the claims, then acknowledge the read: a job whose claims were taken over while it was frozen gets
    ``ClaimLostError`` from the ledger and acknowledges nothing (its cursor may lag its successor's)."""
    async with open_connection(options.settings) as conn:
        if consumption.claimed:
            ledger = await BatchLedger.open(conn, ledger_bucket)
            await ledger.settle(consumption.claimed, error=error)
        if error is None:
            consumption.removed = await acknowledge_read(conn, consumption.plan)


@contextmanager
def consume(spark: Any, options: Mapping[str, str], *, schema: StructType | str | None = None,
            run_id: str | None = None, ledger_bucket: str = "batch_ledger",
            owner: str = "spark-consume",
            visibility_timeout: float | str | timedelta = "10m") -> Iterator[tuple[Any, Consumption]]:
    """Consume a stream with acknowledgement deferred until the job succeeded::

        with consume(spark, {"servers": url, "stream": "ORDERS"}) as (df, consumption):
            df.groupBy("subject").count().write.mode("overwrite").parquet(out)
        # here the messages df covered are removed from the stream; new ones stay

    Interest and Limits streams need ``options["consumer"]``: a durable consumer (deliver policy
    ``all``, created when missing) that only this job uses as its cursor; the read starts after its
    ack floor and uses its filters, and the acknowledgement moves its ack floor to the read's end
    (an Interest stream then drops what no other consumer needs). A WorkQueue stream needs no
    consumer: the acknowledgement purges what was read.

    The bounds are fixed on entry, so every action on ``df`` sees the same messages. When the
    block raises, nothing is removed (a re-run reads the same messages plus newer ones); write the
    output idempotently (overwrite) so a re-run after a failure between writing and removing
    leaves each message in the output exactly once. With ``run_id`` the run's batches in the batch
    ledger are claimed on entry and marked consumed before the removal (released on failure); a job whose
    claims were lost meanwhile raises ``ClaimLostError`` and removes nothing. ``Consumption.claim_revisions``
    are the claims' tokens, to fence the output with (docs/ledger.md). ``Consumption.already_consumed`` says the
    run was consumed before (a re-run of a job whose success was not heard): keep that output, write none.
    ``visibility_timeout`` is the claims' deadline (seconds, ``"10m"`` or a timedelta): past it, another attempt
    may take the batches over; before it, a job that finds batches of the run held by another attempt gives back
    what it claimed and raises ``LedgerConflictError`` on entry, reading nothing.
    """
    opts = {**lowered(options), "consume": "true"}
    parsed = ReadOptions.parse(with_connection_defaults(session_connection_fields(spark), opts))
    started = time.monotonic()
    plan = asyncio.run(plan_for(parsed))
    pinned = {**opts, "start_seq": str(plan.first_seq), "end_seq": str(max(plan.last_seq, 0)),
              "num_partitions": str(max(1, len(plan.ranges)))}
    if plan.workers:
        del pinned["num_partitions"]
    elif plan.subjects:
        pinned["filter_subjects"] = ",".join(plan.subjects)
    reader = spark.read.format("jetstream").options(**pinned)
    if schema is not None:
        reader = reader.schema(schema)
    df = reader.load()
    claims, already_consumed = asyncio.run(_claim(parsed, run_id, ledger_bucket, owner, visibility_timeout))
    consumption = Consumption(plan, claims, already_consumed=already_consumed)
    try:
        yield df, consumption
    except BaseException as exc:
        asyncio.run(_finish(parsed, consumption, ledger_bucket, f"{type(exc).__name__}: {exc}"))
        raise
    asyncio.run(_finish(parsed, consumption, ledger_bucket, None))
    seconds = time.monotonic() - started
    progress(f"consume {plan.stream}: read {plan.messages} message(s) seq {plan.first_seq}..{plan.last_seq}, "
             f"removed {consumption.removed or 0}, {len(consumption.claimed)} batch(es) consumed, "
             f"in {seconds:.1f} s ({rate(plan.messages, seconds)})")
