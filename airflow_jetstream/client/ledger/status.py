"""A run's summary as sensors, triggers and the view read it: one direct get of the run's counts.

Nothing here writes (observing never writes). A run without counts is either not recorded yet (one more
small read tells) or recorded before the ledger kept counts: that run is listed instead (O(n), as before),
and says so with ``counted_by: "listing"``.
"""

from __future__ import annotations

from typing import Any

from airflow_jetstream.client.admin.streams import find_stream
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import StreamNotFoundError
from airflow_jetstream.client.ledger.counts import counts_pattern, decode_counts, merged
from airflow_jetstream.client.ledger.listing import listed_summary
from airflow_jetstream.client.ledger.records import check_id, key_token
from airflow_jetstream.client.ledger.store import Entry, read_last, stream_of, subject_of
from airflow_jetstream.client.reading.direct import get_message


async def read_counts(conn: JetStreamConnection, bucket: str, run_id: str) -> dict[int, dict[str, Any]] | None:
    """The run's counts shards by number (``{}``: none stored), or None when the bucket cannot be read
    with direct gets (it does not exist, or an older version created it and no writer opened it since)."""
    try:
        entries = await read_last(conn, bucket, [counts_pattern(run_id)])
    except StreamNotFoundError:
        return None
    return shards_of(entries)


def shards_of(entries: dict[str, Entry]) -> dict[int, dict[str, Any]]:
    """Decoded counts shards by number, from the last values of a run's counts keys."""
    return {int(key.rsplit(".", 1)[1]): decode_counts(entry.data, key, entry.seq)
            for key, entry in entries.items() if not entry.deleted}


async def run_recorded(conn: JetStreamConnection, bucket: str, run_id: str) -> bool:
    """Whether any batch key of the run is stored (a record, or a delete marker), in one small read."""
    pattern = subject_of(bucket, f"{key_token(check_id(run_id, 'run_id'))}.*")
    return await get_message(conn, stream_of(bucket), seq=1, subject=pattern, next_after=True, direct=True) is not None


async def run_summary(conn: JetStreamConnection, bucket: str, run_id: str, now: float) -> dict[str, Any]:
    """The run's summary (:func:`~airflow_jetstream.client.ledger.counts.merged`): from its counts in one read;
    a missing bucket is a run without batches."""
    shards = await read_counts(conn, bucket, run_id)
    if shards:
        return merged(run_id, bucket, shards, now)
    if shards is None:
        if await find_stream(conn, stream_of(bucket)) is None:
            return merged(run_id, bucket, {}, now)
        return await listed_summary(conn, bucket, run_id, now)
    if not await run_recorded(conn, bucket, run_id):
        return merged(run_id, bucket, {}, now)
    return await listed_summary(conn, bucket, run_id, now)
