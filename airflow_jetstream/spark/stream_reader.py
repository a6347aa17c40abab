"""The streaming read of the ``jetstream`` data source: ``spark.readStream.format("jetstream")`` (docs/streaming.md).

Offsets are stream sequences (``{"stream": "ORDERS", "seq": n}``: Spark has every message up to ``n``); a
micro-batch from ``a`` to ``b`` reads ``a+1..b`` with the batch read's planning and columns. Spark writes a
micro-batch's offsets to the checkpoint before it runs and a commit after the sink finished, so every
message is read exactly once per checkpoint. Read limits need pyspark 4.2 (``max_bytes_per_trigger`` is
soft: turned into sequences with the stream's average message size); ``end_seq``/``end_time`` bound every
micro-batch. With ``consume=true`` a micro-batch is acknowledged when Spark commits its end offset, which
it does only after the micro-batch's commit is in the checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from airflow_jetstream.client.admin.streams import first_seq_at_or_after, stream_info
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.reading.read_plan import acknowledge_read, plan_read, read_method, resolve_start
from airflow_jetstream.spark.options import StreamReadOptions
from airflow_jetstream.spark.progress import progress
from airflow_jetstream.spark.reader import check_read_schema, plan_for, read_batches

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
    _BASES: tuple[type, ...] = (DataSourceStreamReader,)
else:
    READ_LIMITS = True
    _BASES = (DataSourceStreamReader, SupportsTriggerAvailableNow)

log = logging.getLogger(__name__)


def check_streaming_read_support(options: StreamReadOptions, pyspark_version: str) -> None:
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


async def _start_seq(options: StreamReadOptions) -> int:
    """The first sequence a new query reads (after the cursor consumer's ack floor, when there is one)."""
    read = options.read
    async with open_connection(read.settings) as conn:
        start_seq = read.start_seq
        if start_seq is None and read.start_time is None:
            start_seq = await resolve_start(conn, read.stream, options.start)
        plan = await plan_read(conn, read.stream, subjects=read.filter_subjects, start_seq=start_seq,
                               start_time=read.start_time, consumer=read.consumer)
    return plan.first_seq


async def _stream_state(options: StreamReadOptions) -> tuple[dict[str, Any], int]:
    """The stream's state and the last sequence the query may read (``end_seq``/``end_time`` applied)."""
    read = options.read
    async with open_connection(read.settings) as conn:
        state = (await stream_info(conn, read.stream))["state"]
        last = int(state.get("last_seq") or 0)
        if read.end_seq is not None:
            last = min(last, read.end_seq)
        if options.end_time is not None:
            last = min(last, await first_seq_at_or_after(conn, read.stream, options.end_time) - 1)
    return state, last


async def _acknowledge(options: StreamReadOptions, last: int) -> int:
    read = options.read
    async with open_connection(read.settings) as conn:
        plan = await plan_read(conn, read.stream, subjects=read.filter_subjects, end_seq=last, consumer=read.consumer)
        return await acknowledge_read(conn, plan)


class JetStreamStreamReader(*_BASES):  # type: ignore[misc]
    """The driver side keeps the query's latest sequence and, under AvailableNow, its target."""

    def __init__(self, options: StreamReadOptions, schema: StructType) -> None:
        check_read_schema(schema, options.read)
        self.options = options
        self.schema = schema
        self.stream = options.read.stream
        #: Trigger.AvailableNow: the last sequence stored when the query started.
        self.target: int | None = None
        #: The stream's last sequence at the latest planning (the progress's ``latestOffset``).
        self.latest: int | None = None
        #: A new query's start, resolved once (Spark asks for it more than once as the query starts).
        self.initial: dict[str, Any] | None = None

    def initialOffset(self) -> dict[str, Any]:
        if self.initial is None:
            first = asyncio.run(_start_seq(self.options))
            progress(f"stream read of {self.stream}: a new query starts at seq {first} (start={self.options.start})")
            self.initial = _offset(self.stream, first - 1)
        return self.initial

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        """The end of the next micro-batch: the stream's last sequence (at most the AvailableNow target),
        capped by the read limit. pyspark 4.0/4.1 call it without arguments (no read limits there)."""
        state, end = asyncio.run(_stream_state(self.options))
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
        self.target = asyncio.run(_stream_state(self.options))[1]
        progress(f"stream read of {self.stream}: Trigger.AvailableNow reads up to seq {self.target}")

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        first, last = _seq(start, self.stream) + 1, _seq(end, self.stream)
        if last < first:
            return []
        read = dataclasses.replace(self.options.read, start_seq=first, start_time=None, end_seq=last)
        plan = asyncio.run(plan_for(read))
        if plan.first_seq > first:
            log.warning("stream %s: seq %d..%d were removed (limits, max age or a purge) before this query read "
                        "them", self.stream, first, plan.first_seq - 1)
        via = read_method(plan, consume=read.consume)
        return [InputPartition((self.stream, via, f, e, subjects)) for f, e, subjects in plan.partitions()]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        stream, via, first, last, subjects = partition.value
        yield from read_batches(self.options.read, self.schema, stream, via, first, last, subjects)

    def commit(self, end: dict[str, Any]) -> None:
        if not self.options.read.consume:
            return
        last = _seq(end, self.stream)
        removed = asyncio.run(_acknowledge(self.options, last))
        progress(f"stream read of {self.stream}: acknowledged up to seq {last} ({removed} message(s) removed)")
