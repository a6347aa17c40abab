"""The write side of the ``jetstream`` data source: each Spark task publishes its rows as batches (docs/spark.md).

Chunk ``c`` of partition ``p`` always holds the same rows for the same input, so its ids are stable across
task attempts and job re-runs: an atomic chunk is fenced as ``<job_id>-<p>-<c>``
(:mod:`~airflow_jetstream.client.batches.atomic`), so it commits at most once however often it is sent; msg
ids add de-duplication within the duplicate window (fast mode, where no fence applies, has one per row).
Every stored chunk is recorded in the batch ledger, and a retry or re-run skips chunks the ledger has. The
driver's ``commit()``/``abort()`` store every partition's report as the job record ``job_id``.

The streaming sink, ``df.writeStream.format("jetstream")`` (docs/streaming.md), writes every micro-batch like one
batch write under its own job id, ``<query id>-<batch id>``: Spark keeps the query id in the checkpoint and replays
a micro-batch under the same batch id, so a replay derives the same msg ids and ledger batch ids for the same rows
and stores nothing twice (the ledger names the chunks already stored; a committed micro-batch's job record makes
its tasks skip it whole). When no task reported (a failure cancelled the others first), the driver takes the query
id from the checkpoint's ``metadata`` file, readable only at a local path. End-to-end exactly once needs a
replayable source (Spark's condition).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from airflow_jetstream.client import server_features
from airflow_jetstream.client.batches.publish_chunks import TargetStream, check_target_stream, publish_chunk
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.kv.job_records import get_job_record, put_job_record
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.spark.driver import progress, rate, run
from airflow_jetstream.spark.json_rows import encode_rows, headers_kind
from airflow_jetstream.spark.options import WriteOptions

log = logging.getLogger(__name__)
#: An unfenced write warns when the stream forgets msg ids sooner than this (Airflow's default retry_delay, s).
UNFENCED_WINDOW_WARNING = 300.0
#: Sequence ranges a task reports (the job record holds every task's report: one KV value).
MAX_REPORTED_RANGES = 100


@dataclass
class PartitionReport(WriterCommitMessage):
    """What one task stored: sent to the driver's commit()/abort() and kept in the job record."""

    partition: int
    attempt: int
    #: The job (a streaming micro-batch's own job id) the rows were written for.
    job_id: str = ""
    rows: int = 0
    batches: int = 0
    stored: int = 0
    skipped_batches: int = 0
    duplicate_batches: int = 0
    ranges: list[list[int]] = field(default_factory=list)
    #: Chunk ranges left out of ``ranges`` past MAX_REPORTED_RANGES (the ledger records every chunk).
    ranges_omitted: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add_range(self, first: int, last: int) -> None:
        """Note a stored chunk's sequences: joined to the previous range when it continues it, and
        kept to MAX_REPORTED_RANGES ranges so the job record stays small for any number of chunks."""
        if self.ranges and self.ranges[-1][1] + 1 == first:
            self.ranges[-1][1] = last
        elif len(self.ranges) < MAX_REPORTED_RANGES:
            self.ranges.append([first, last])
        else:
            self.ranges_omitted += 1


def partition_reports(messages: list[WriterCommitMessage | None]) -> list[PartitionReport]:
    """The tasks' reports among what Spark hands to ``commit()``/``abort()`` (None for a task that sent none)."""
    return [m for m in messages if isinstance(m, PartitionReport)]


def message_id(job_id: str, partition: int, row: int) -> str:
    """The deterministic msg id of a row: job, partition and row index within the partition."""
    return f"{job_id}-{partition}-{row}"


def chunk_id(job_id: str, partition: int, chunk: int) -> str:
    """The ledger batch id of a chunk (stable across task attempts and job re-runs)."""
    return f"{job_id}-{partition}-{chunk}"


class PartitionLedger:
    """What one write task reads of the ledger: whether its own chunks are recorded, looked up ``LOOKAHEAD``
    chunk ids at a time (one request on a single server, one message get per id from the stream leader on a
    cluster), never the whole run, which other tasks write too."""

    LOOKAHEAD = 64

    def __init__(self, ledger: BatchLedger, run_id: str, job_id: str, partition: int) -> None:
        self.ledger, self.run_id, self.job_id, self.partition = ledger, run_id, job_id, partition
        self._window = range(0)
        self._recorded: set[int] = set()

    async def recorded(self, chunk: int) -> bool:
        """Whether chunk ``chunk`` of this task is in the ledger (a task attempt or job run before stored it)."""
        if chunk not in self._window:
            self._window = range(chunk, chunk + self.LOOKAHEAD)
            ids = {chunk_id(self.job_id, self.partition, index): index for index in self._window}
            # from the leader on a cluster: a replica catching up (a node just restarted) could miss a chunk an
            # earlier attempt recorded, and the chunk would be published again
            found = await self.ledger.get_many(self.run_id, ids, leader=self.ledger.conn.clustered)
            self._recorded = {ids[batch_id] for batch_id in found}
        return chunk in self._recorded


def check_write_schema(schema: StructType, options: WriteOptions) -> None:
    """Refuse, on the driver, a DataFrame whose columns cannot be turned into messages."""
    types = {f.name: f.dataType for f in schema.fields}
    subject_type = types.get(options.subject_column)
    if subject_type is None and not options.subject:
        raise InvalidRequestError(
            f"no subject: the DataFrame has no {options.subject_column!r} column and option subject is not set; "
            "add a string column with each row's subject or .option('subject', 'orders.new')",
            reason="missing_subject",
        )
    if subject_type is not None and not isinstance(subject_type, StringType):
        raise InvalidRequestError(
            f"column {options.subject_column!r} must be a string, not {subject_type.simpleString()}",
            reason="invalid_column",
        )
    payload_type = types.get(options.payload_column)
    if payload_type is not None and not isinstance(payload_type, (BinaryType, StringType)):
        raise InvalidRequestError(
            f"column {options.payload_column!r} must be binary or string, not {payload_type.simpleString()}; "
            "or drop it to send every other column as a JSON object",
            reason="invalid_column",
        )
    if options.headers_column in types:
        headers_kind(types[options.headers_column], options.headers_column, "invalid_column")
    if payload_type is None and not (set(types) - {options.subject_column, options.headers_column}):
        raise InvalidRequestError("the DataFrame has no payload column and no other column to send as JSON",
                                  reason="invalid_column")


def encode_batch(options: WriteOptions, batch: Any) -> list[tuple[str, bytes, dict[str, str] | None]]:
    """An Arrow record batch as (subject, payload, headers) triples."""
    import pyarrow as pa

    names = batch.schema.names

    def values(name: str) -> list[Any]:
        return batch.column(name).to_pylist() if name in names else [None] * batch.num_rows

    subjects: list[Any] = [options.subject if s is None else s for s in values(options.subject_column)]
    if options.payload_column in names:
        # Arrow turns UTF-8 strings into bytes without a Python call per row.
        column = batch.column(options.payload_column)
        if not pa.types.is_binary(column.type):
            column = column.cast(pa.binary())
        payloads = column.to_pylist()
        if column.null_count:
            payloads = [p or b"" for p in payloads]
    else:
        data_columns = [n for n in names if n not in (options.subject_column, options.headers_column)]
        payloads = encode_rows(batch, data_columns)  # the row JSON contract (spark/json_rows.py)
    headers = [dict(h) if h else None for h in values(options.headers_column)]
    return list(zip(subjects, payloads, headers, strict=True))


async def _first_completed(running: set[asyncio.Task[None]]) -> None:
    """Wait until one of ``running`` finished; re-raise its error."""
    done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        running.discard(task)
        task.result()


class JetStreamWriter(DataSourceArrowWriter):
    """Built on the driver and pickled to every task; connects inside :meth:`write`."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        check_write_schema(schema, options)
        run(options.settings, self._check_stream)

    def for_job(self, job_id: str) -> JetStreamWriter:
        """This writer for job ``job_id`` (also its run in the ledger), without checking the stream again."""
        other = copy.copy(self)
        other.options = replace(self.options, job_id=job_id, job_id_given=True, run_id=job_id)
        return other

    async def _check_stream(self, conn: JetStreamConnection) -> None:
        feature = server_features.ATOMIC_BATCH if self.options.mode == "atomic" else server_features.FAST_BATCH
        server_features.require(conn, feature, what=f"the jetstream data source's mode={self.options.mode}")
        target = await self._target(conn, [self.options.subject] if self.options.subject else [])
        if not target.fenced and target.duplicate_window < UNFENCED_WINDOW_WARNING:
            log.warning("jetstream write to %s in %s mode%s: a chunk committed but not yet in the ledger is protected "
                        "from a retry only for the stream's duplicate_window (%.0f s), shorter than Airflow's default "
                        "retry_delay (300 s); raise the window or write in atomic mode with fence=true",
                        target.name, self.options.mode, "" if self.options.fence else " with fence=false",
                        target.duplicate_window)

    async def _target(self, conn: JetStreamConnection, subjects: list[str] | None = None) -> TargetStream:
        """The stream checked for this write's mode (and ``subjects``): the publish operator's rule."""
        return await check_target_stream(conn, self.options.stream, subjects or [], mode=self.options.mode,
                                         fence=self.options.fence)

    def write(self, iterator: Any) -> PartitionReport:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        return run(self.options.settings, self._write, partition, attempt, iterator)

    async def _write(self, conn: JetStreamConnection, partition: int, attempt: int, iterator: Any) -> PartitionReport:
        opts = self.options
        report = PartitionReport(partition=partition, attempt=attempt, job_id=opts.job_id)
        started = time.monotonic()
        pending: list[tuple[str, bytes, dict[str, str] | None]] = []
        chunk = 0
        running: set[asyncio.Task[None]] = set()
        ledger = await self._ledger(conn, partition)
        target = await self._target(conn)

        async def submit(rows: list[tuple[str, bytes, dict[str, str] | None]]) -> None:
            nonlocal chunk
            first_row, report.rows, report.batches = report.rows, report.rows + len(rows), report.batches + 1
            index, chunk = chunk, chunk + 1
            if ledger is not None and await ledger.recorded(index):
                report.skipped_batches += 1
                return
            while len(running) >= opts.inflight:
                await _first_completed(running)
            running.add(asyncio.create_task(self._publish_chunk(conn, target, ledger, report, index, first_row, rows)))

        try:
            for batch in iterator:
                pending.extend(encode_batch(opts, batch))
                while len(pending) >= opts.batch_size:
                    await submit(pending[:opts.batch_size])
                    del pending[:opts.batch_size]
            if pending:
                await submit(pending)
            while running:
                await _first_completed(running)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        report.seconds = round(time.monotonic() - started, 3)
        log.info("jetstream write: partition %d attempt %d stored %d of %d rows in %d batches (%d skipped)",
                 partition, attempt, report.stored, report.rows, report.batches, report.skipped_batches)
        return report

    async def _ledger(self, conn: JetStreamConnection, partition: int) -> PartitionLedger | None:
        """This partition's view of the ledger (None when disabled)."""
        if not self.options.ledger_bucket:
            return None
        ledger = await BatchLedger.open(conn, self.options.ledger_bucket, replicas=self.options.ledger_replicas,
                                        placement=self.options.ledger_placement, ttl=self.options.ledger_ttl)
        return PartitionLedger(ledger, self.options.run_id, self.options.job_id, partition)

    async def _publish_chunk(self, conn: JetStreamConnection, target: TargetStream, ledger: PartitionLedger | None,
                             report: PartitionReport, chunk: int, first_row: int,
                             rows: list[tuple[str, bytes, dict[str, str] | None]]) -> None:
        opts = self.options
        await target.require(conn, {subject for subject, _, _ in rows})
        key = chunk_id(opts.job_id, report.partition, chunk)
        if opts.mode == "atomic":  # the chunk's deterministic msg id on its first message; fast: each row's own
            ids = [f"{opts.job_id}-{report.partition}-c{chunk}"] + [None] * (len(rows) - 1)
        else:
            ids = [message_id(opts.job_id, report.partition, row) for row in range(first_row, first_row + len(rows))]
        messages = [BatchMessage(*row, msg_id) for row, msg_id in zip(rows, ids, strict=True)]
        result = await publish_chunk(conn, messages, mode=opts.mode, batch_id=f"{key}-a{report.attempt}",
                                     max_msgs=opts.batch_size, flow=opts.flow, target=target, fence_id=key)
        if result.already_committed or result.duplicates == len(rows):
            report.duplicate_batches += 1
        else:
            report.stored += result.count - result.duplicates
        if result.first_seq is not None:
            report.add_range(result.first_seq, result.last_seq)
        if ledger is not None:
            await ledger.ledger.record(opts.run_id, key, stream=result.stream or opts.stream, count=result.count,
                                first_seq=result.first_seq, last_seq=result.last_seq,
                                meta={"job_id": opts.job_id, "partition": report.partition, "mode": opts.mode,
                                      "first_row": first_row})

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._finish("committed", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._finish("aborted", messages)

    def _finish(self, state: str, messages: list[WriterCommitMessage | None]) -> None:
        """One progress line per partition and a total, on the driver (so in the task log); then the job record."""
        opts = self.options
        reports = partition_reports(messages)
        for r in reports:
            progress(f"write {opts.stream} job {opts.job_id} partition {r.partition}: "
                     f"{r.stored} of {r.rows} rows stored in {r.batches} batch(es) ({r.skipped_batches} skipped) "
                     f"in {r.seconds:.1f} s ({rate(r.rows, r.seconds)})")
        # the job's sums of what its tasks reported (the job record's counts)
        total = {name: sum(getattr(r, name) for r in reports)
                 for name in ("rows", "stored", "batches", "skipped_batches", "duplicate_batches")}
        busiest = max((r.seconds for r in reports), default=0.0)
        progress(f"write {opts.stream} job {opts.job_id} {state}: {total['stored']} of {total['rows']} "
                 f"rows stored in {total['batches']} batch(es) from {len(reports)} of {len(messages)} partition(s), "
                 f"slowest partition {busiest:.1f} s")
        record = {
            "job_id": opts.job_id,
            "run_id": opts.run_id,
            "stream": opts.stream,
            "mode": opts.mode,
            "state": state,
            "partitions": len(messages),
            "partitions_reported": len(reports),
            **total,
            "ledger_bucket": opts.ledger_bucket,
            "finished_at": datetime.now(UTC).isoformat(),
            "reports": [r.to_dict() for r in reports],
        }
        run(opts.settings, put_job_record, opts.job_id, record, bucket=opts.job_bucket, replicas=opts.ledger_replicas,
            placement=opts.ledger_placement)


try:  # pyspark 4.1+
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pyspark 4.0: only the row-by-row stream writer
    ARROW_STREAM_WRITER = False
    DataSourceStreamArrowWriter = object  # type: ignore[assignment,misc]
else:
    ARROW_STREAM_WRITER = True

#: Local properties Spark sets on every task of a micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def check_streaming_write_support(options: dict[str, str], pyspark_version: str) -> None:
    """Refuse what a streaming sink cannot take: ids it derives, a pyspark without Arrow stream writers."""
    given = [name for name in ("job_id", "run_id") if options.get(name)]  # derived per micro-batch
    if given:
        raise InvalidRequestError(
            f"option(s) {', '.join(given)} cannot be set on a streaming write: each micro-batch is job "
            "<query id>-<batch id> (stable across restarts from the same checkpoint)",
            reason="invalid_option",
        )
    if not ARROW_STREAM_WRITER:
        raise InvalidRequestError(
            f"df.writeStream.format('jetstream') needs pyspark 4.1 or later (Arrow stream writers); this is "
            f"pyspark {pyspark_version}",
            reason="pyspark_too_old",
        )


def micro_batch_job_id(query_id: str, batch_id: int) -> str:
    """The job id of micro-batch ``batch_id`` of query ``query_id`` (its UUID, kept in the checkpoint)."""
    return f"{query_id.replace('-', '')}-{batch_id}"


def checkpoint_query_id(checkpoint_location: str | None) -> str | None:
    """The query id in ``<checkpoint location>/metadata`` (Spark's ``{"id": ...}``), when the location is
    an absolute local path or a ``file:`` URI and the file is readable; otherwise None."""
    parsed = urlparse(checkpoint_location or "")
    directory = Path(url2pathname(parsed.path)) if parsed.scheme == "file" else Path(checkpoint_location or "")
    if parsed.scheme not in ("", "file") or not directory.is_absolute():  # hdfs:, s3a:, ...: not readable here
        return None
    try:
        first_line = (directory / "metadata").read_text(encoding="utf-8").partition("\n")[0]
        query_id = json.loads(first_line).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return query_id if isinstance(query_id, str) and query_id else None


def _job_state(options: WriteOptions) -> str | None:
    record = run(options.settings, get_job_record, options.job_id, bucket=options.job_bucket)
    return None if record is None else record.get("state")


class JetStreamStreamWriter(DataSourceStreamArrowWriter):
    """Built on the driver for every micro-batch (it checks the stream once) and pickled to the tasks.

    ``query_id`` is the query's id when the driver could read it from the checkpoint: it names the job
    of a micro-batch none of whose tasks reported."""

    def __init__(self, options: WriteOptions, schema: StructType, query_id: str | None = None) -> None:
        self.writer = JetStreamWriter(options, schema)
        self.query_id = query_id

    def write(self, iterator: Any) -> PartitionReport:
        from pyspark import TaskContext

        context = TaskContext.get()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        if context is None or not query_id or batch_id is None:
            raise InvalidRequestError("the streaming sink runs only inside a streaming query's micro-batch "
                                      "(no query or batch id on the task)", reason="invalid_request")
        writer = self.writer.for_job(micro_batch_job_id(query_id, int(batch_id)))
        if _job_state(writer.options) != "committed":
            return writer.write(iterator)
        # a replay of a micro-batch the driver committed before: nothing is published
        rows = sum(batch.num_rows for batch in iterator)
        chunks = -(-rows // writer.options.batch_size)
        return PartitionReport(partition=context.partitionId(), attempt=context.attemptNumber(),
                               job_id=writer.options.job_id, rows=rows, batches=chunks, skipped_batches=chunks)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        writer = self._for(messages, batchId)
        if writer is None:
            return
        if _job_state(writer.options) == "committed":
            progress(f"stream write {writer.options.stream} micro-batch {batchId} (job {writer.options.job_id}): "
                     "committed before; this replay stored nothing again")
            return
        writer.commit(messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        writer = self._for(messages, batchId)
        if writer is not None:
            writer.abort(messages)

    def _for(self, messages: list[WriterCommitMessage | None], batch_id: int) -> JetStreamWriter | None:
        job_id = next((m.job_id for m in partition_reports(messages) if m.job_id), None)
        if job_id is None and self.query_id:
            job_id = micro_batch_job_id(self.query_id, batch_id)
        if job_id is None:
            progress(f"stream write {self.writer.options.stream} micro-batch {batch_id}: no task reported "
                     f"({len(messages)} partition(s)) and the checkpoint is not a local path; no job record")
            return None
        return self.writer.for_job(job_id)
