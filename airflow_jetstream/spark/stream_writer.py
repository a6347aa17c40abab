"""The streaming sink of the ``jetstream`` data source: ``df.writeStream.format("jetstream")`` (docs/streaming.md).

Every micro-batch is written like one batch write under its own job id, ``<query id>-<batch id>``: Spark
keeps the query id in the checkpoint and replays a micro-batch under the same batch id, so a replay derives
the same msg ids and ledger batch ids for the same rows and stores nothing twice (the ledger names the chunks
already stored; a committed micro-batch's job record makes its tasks skip it whole). When no task reported
(a failure cancelled the others first), the driver takes the query id from the checkpoint's ``metadata``
file, readable only at a local path. End-to-end exactly once needs a replayable source (Spark's condition).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.kv.job_records import get_job_record
from airflow_jetstream.spark.options import WriteOptions
from airflow_jetstream.spark.progress import progress
from airflow_jetstream.spark.writer import JetStreamWriter, PartitionReport, partition_reports

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
#: Write options a streaming sink derives itself.
DERIVED_OPTIONS = ("job_id", "run_id")


def check_streaming_write_support(options: dict[str, str], pyspark_version: str) -> None:
    """Refuse what a streaming sink cannot take: ids it derives, a pyspark without Arrow stream writers."""
    given = [name for name in DERIVED_OPTIONS if options.get(name)]
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
    if not checkpoint_location:
        return None
    parsed = urlparse(checkpoint_location)
    if parsed.scheme == "file":
        directory = Path(url2pathname(parsed.path))
    elif not parsed.scheme:
        directory = Path(checkpoint_location)
    else:  # hdfs:, s3a:, ...: not readable here
        return None
    if not directory.is_absolute():
        return None
    try:
        first_line = (directory / "metadata").read_text(encoding="utf-8").partition("\n")[0]
        query_id = json.loads(first_line).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return query_id if isinstance(query_id, str) and query_id else None


async def _job_state(options: WriteOptions) -> str | None:
    async with open_connection(options.settings) as conn:
        record = await get_job_record(conn, options.job_id, bucket=options.job_bucket)
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
        if not query_id or batch_id is None:
            raise InvalidRequestError("the streaming sink runs only inside a streaming query's micro-batch "
                                      "(no query or batch id on the task)", reason="invalid_request")
        writer = self.writer.for_job(micro_batch_job_id(query_id, int(batch_id)))
        if asyncio.run(_job_state(writer.options)) == "committed":
            return self._skip_committed(writer.options, context, iterator)
        return writer.write(iterator)

    @staticmethod
    def _skip_committed(options: WriteOptions, context: Any, iterator: Any) -> PartitionReport:
        """A replay of a micro-batch the driver committed before: nothing is published."""
        rows = sum(batch.num_rows for batch in iterator)
        chunks = -(-rows // options.batch_size)
        return PartitionReport(partition=context.partitionId(), attempt=context.attemptNumber(),
                               job_id=options.job_id, rows=rows, batches=chunks, skipped_batches=chunks)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        writer = self._for(messages, batchId)
        if writer is None:
            return
        if asyncio.run(_job_state(writer.options)) == "committed":
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
