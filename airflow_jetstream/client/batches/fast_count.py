"""What a fast batch stored when the server cannot say: counted by reading the stream back, and the
messages the server skipped as duplicates of stored msg ids (probed without writing)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from airflow_jetstream.client.admin.subject_streams import streams_for_subject
from airflow_jetstream.client.batches.fast_run import RESUME_PAUSE_FIRST, RESUME_PAUSE_MAX, settle_wait
from airflow_jetstream.client.batches.msg_id_probe import stored_sequences
from airflow_jetstream.client.batches.types import HEADER_MSG_ID, BatchMessage
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import BatchPublishError, JetStreamError, LeaderUnavailableError
from airflow_jetstream.client.reading.range_read import read_range

log = logging.getLogger(__name__)


def _matches(item: BatchMessage, stored: tuple[str, int, int, Any, bytes]) -> bool:
    subject, _seq, _ts, headers, data = stored
    if subject != item.subject or bytes(data or b"") != bytes(item.data):
        return False
    headers = headers or {}
    if item.msg_id is not None and headers.get(HEADER_MSG_ID) != item.msg_id:
        return False
    return all(headers.get(k) == v for k, v in (item.headers or {}).items())


async def count_in_stream(conn: JetStreamConnection, stream: str, after: int,
                           items: Sequence[BatchMessage]) -> tuple[int, int | None, int]:
    """How many of ``items`` (an in-order prefix) the stream holds after seq ``after``, the sequence of
    the last of them (None when none), and the stream's last sequence read. Messages of other
    publishers in between are skipped. Waits for a leader (:func:`settle_wait`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle_wait(conn)
    pause = RESUME_PAUSE_FIRST
    while True:
        try:
            return await _read_and_count(conn, stream, after, items)
        except LeaderUnavailableError:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, RESUME_PAUSE_MAX)


async def _read_and_count(conn: JetStreamConnection, stream: str, after: int,
                          items: Sequence[BatchMessage]) -> tuple[int, int | None, int]:
    info = await conn.api_request(f"STREAM.INFO.{stream}", context=f"stream {stream!r}")
    retention = info["config"].get("retention", "limits")
    if retention != "limits":
        raise JetStreamError(f"stream {stream!r} has {retention} retention: its messages may be consumed before "
                             "they can be counted", reason="stored_unknown")
    last = int(info["state"]["last_seq"])
    found = 0
    found_last: int | None = None
    via = "direct" if info["config"].get("allow_direct") else "consumer"
    async for chunk in read_range(conn, stream, after + 1, last, via=via):
        for stored in chunk:
            if found < len(items) and _matches(items[found], stored):
                found += 1
                found_last = stored[1]
    return found, found_last, last


async def count_duplicates(conn: JetStreamConnection, stream: str, run: Sequence[BatchMessage],
                      mark: int) -> tuple[int, int | None]:
    """For a run the server skipped some messages of as duplicates: how many of its messages were
    stored at or before seq ``mark`` (by msg id, probed without writing) and the sequence of its last
    one (None when its msg id is not in the duplicate window any more)."""
    seqs = await stored_sequences(conn, run, stream=stream)
    earlier = sum(1 for seq in seqs if seq is not None and seq <= mark)
    log.info("fast batch on stream %s: %d of %d message(s) were already stored (msg ids), the last at seq %s",
             stream, earlier, len(run), seqs[-1] if seqs else None)
    return earlier, seqs[-1] if seqs else None


async def stream_and_last_seq(conn: JetStreamConnection, subject: str, batch_id: str) -> tuple[str, int]:
    """The stream capturing ``subject`` and its last sequence before the batch (where counting starts)."""
    streams = await streams_for_subject(conn, subject)
    if not streams:
        raise BatchPublishError(f"fast batch {batch_id}: no stream captures subject {subject!r}; create the "
                                "stream or fix the subject", reason="no_stream_for_subject")
    info = await conn.api_request(f"STREAM.INFO.{streams[0]}", context=f"stream {streams[0]!r}")
    return streams[0], int(info["state"]["last_seq"])
