"""The ledger bucket on the wire: the bucket created or brought to what the ledger needs, the last value of
keys in one direct get, writes that are compare-and-set on every key they touch (several keys as one atomic
batch), and the listing of a run's records.

A write names, for each key, the sequence its last value had when it was read (0: the key must not
exist); the server checks all of them when the batch commits (``Nats-Expected-Last-Subject-Sequence``
on each message) and stores all of the batch or nothing (nats-server 2.12+, the bucket's stream needs
``allow_atomic``). A moved key is :class:`CasConflict`: read again and decide again.

A write that got no answer may or may not be stored: callers read again and compare (the ledger's
transitions do), they never send the same write twice blindly.

The bucket: the ledger writes a record and its run's counts as one atomic batch and reads them with direct
gets, so its bucket's stream (``KV_<bucket>``) has ``allow_atomic`` and ``allow_direct`` (nats-server 2.12+). A
writer's :meth:`BatchLedger.open <airflow_jetstream.client.ledger.batch_ledger.BatchLedger.open>` sets
them on a bucket an older version created; readers (sensors, triggers, the view) never change it.
Retention: a new bucket keeps every key :data:`DEFAULT_TTL` after its last change (``ttl``); a size bound
(``max_bytes``) is optional. An existing bucket keeps its own unless told otherwise.

A run's summary (:func:`run_summary`, what sensors, triggers and :meth:`BatchLedger.summary` show) is its counts
merged (:func:`~.counts.merged`): one direct get. A run without counts is either not recorded yet (one more small
read tells) or recorded before the ledger kept counts: that run is listed instead (O(n), as before), counted the
same way (:func:`~.counts.summarized`, as the view counts the records it read), and says so with
``counted_by: "listing"``. Observing never writes.

Counts drift from the records only when something writes records without them: a service that does not follow
the ledger contract, a record deleted or edited by hand, or a run recorded by a version before the ledger kept
counts. A recount (:func:`recount_run`) lists the run (O(n)), counts its records per shard and compares; a
repair writes the shards that differ as one atomic batch, each compare-and-set on what was read before the
listing, so a change made meanwhile makes it start over.

Listing a run's batch records is O(n) in the run's size, for what needs every record (claiming a whole
run, the reaper once a claim may have expired, a recount, runs recorded before the ledger kept counts).
A run is listed with one short-lived consumer (deliver policy ``last_per_subject`` on ``<run>.*``, read
until nothing is pending; delete and purge markers are skipped). Counts keys (``<run>./counts.<n>``) are
not records and never listed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, aclosing
from datetime import timedelta
from typing import Any

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.streams import ensure_stream, find_stream
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    InvalidRequestError,
    JetStreamError,
    LedgerConflictError,
    LedgerNotFoundError,
    StreamNotFoundError,
)
from airflow_jetstream.client.kv import errors, keys
from airflow_jetstream.client.kv.bucket import bucket_replicas, create_bucket
from airflow_jetstream.client.kv.keys import CasConflict, Write, is_marker
from airflow_jetstream.client.ledger.counts import (
    count_record,
    empty_counts,
    encode_counts,
    merged,
    recounted,
    shards_of,
    summarized,
)
from airflow_jetstream.client.ledger.records import (
    KEY_SAFE,
    SHARDS,
    BatchRecord,
    Entry,
    check_id,
    counts_key,
    counts_pattern,
    is_counts_key,
    key_token,
    shard_of,
)
from airflow_jetstream.client.reading.stored import get_message, last_per_subject, read_latest_per_subject

log = logging.getLogger(__name__)

#: How long a new ledger bucket keeps a key after its last change: 30 days.
DEFAULT_TTL = 30 * 24 * 3600.0
#: A create met a stream of that name with another config (another writer created and prepared it meanwhile).
_NAME_IN_USE = 10058
_UNBOUNDED_WARNED: set[str] = set()
_COMPARED = ("batches", "states", "messages", "attempts", "streams")
#: Repairs one recount tries before giving up while writers keep changing the run.
REPAIR_ATTEMPTS = 5

def kv_errors(conn: JetStreamConnection, bucket: str, context: str, *,
              fail_fast: bool = True) -> AbstractAsyncContextManager[None]:
    """The KV wing's one error mapping (:func:`~airflow_jetstream.client.kv.errors.kv_errors`: permission refusals
    fail fast naming the subject) for the ledger's calls on ``bucket``, a missing bucket reported as the ledger's."""
    return errors.kv_errors(conn, bucket, context, fail_fast=fail_fast, missing=_missing)


def stream_of(bucket: str) -> str:
    return f"KV_{bucket}"


def subject_of(bucket: str, key: str) -> str:
    return f"$KV.{bucket}.{key}"


async def read_last(conn: JetStreamConnection, bucket: str, keys: Sequence[str], *,
                    leader: bool = False) -> dict[str, Entry]:
    """The last value of each key matching ``keys`` (keys and key filters with ``*``/``>``), by key; keys never
    written are absent. One direct get, answered by any replica: one still applying the latest writes may answer
    an older value. ``leader`` (literal keys only) asks the stream leader instead, one message get per key at
    once, for reads that must see every write made before them."""
    prefix = subject_of(bucket, "")
    if leader:
        found = await asyncio.gather(*(get_message(conn, stream_of(bucket), subject=prefix + key) for key in keys))
        messages = {msg.subject: msg for msg in found if msg is not None}
    else:
        messages = await last_per_subject(conn, stream_of(bucket), [prefix + key for key in keys])
    return {subject[len(prefix):]: Entry(key=subject[len(prefix):], seq=msg.seq, data=msg.data,
                                         deleted=is_marker(msg.headers))
            for subject, msg in messages.items()}


async def read_entries(conn: JetStreamConnection, bucket: str, keys: list[str], *,
                       leader: bool = False) -> dict[str, Entry]:
    """:func:`read_last`, a bucket that cannot be read with direct gets being :class:`LedgerNotFoundError`."""
    try:
        return await read_last(conn, bucket, keys, leader=leader)
    except StreamNotFoundError:
        raise LedgerNotFoundError(
            f"ledger bucket {bucket!r} does not exist, or does not allow direct gets (a bucket an older "
            "version created): open it with BatchLedger.open(conn, bucket)") from None


async def run_recorded(conn: JetStreamConnection, bucket: str, run_id: str) -> bool:
    """Whether any batch key of the run is stored (a record, or a delete marker), in one small read."""
    pattern = subject_of(bucket, f"{key_token(check_id(run_id, 'run_id'))}.*")
    return await get_message(conn, stream_of(bucket), seq=1, subject=pattern, next_after=True, direct=True) is not None


async def write(conn: JetStreamConnection, bucket: str, writes: Sequence[Write], *, context: str) -> int:
    """:func:`~airflow_jetstream.client.kv.keys.write` to the ledger's bucket: all or none, each compare-and-set
    (:class:`CasConflict` when a key moved); a missing bucket is :class:`LedgerNotFoundError`."""
    return await keys.write(conn, bucket, writes, context=context, missing=_missing)


def _missing(where: str) -> JetStreamError:
    return LedgerNotFoundError(f"{where}: the ledger bucket does not exist; open it with create=True")


def check_bucket_name(bucket: object) -> str:
    if not isinstance(bucket, str) or not bucket or set(bucket) - KEY_SAFE:
        raise InvalidRequestError(
            f"ledger bucket {bucket!r} is not a valid KV bucket name (letters, digits, '_' and '-' only)",
            reason="invalid_name",
        )
    return bucket


def retention_of(config: dict[str, Any]) -> dict[str, Any]:
    """``{"ttl": seconds or None, "max_bytes": bytes or None}`` of a bucket's stream config (None: no bound)."""
    max_age = int(config.get("max_age") or 0)
    max_bytes = int(config.get("max_bytes") or -1)
    return {"ttl": max_age / 1e9 if max_age > 0 else None, "max_bytes": max_bytes if max_bytes > 0 else None}


def _retention_fields(ttl: float | str | timedelta | None, max_bytes: int | None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if ttl is not None:
        seconds = to_seconds(ttl, field="ttl")
        if seconds < 0:
            raise InvalidRequestError(f"ttl must be >= 0 (0: keep keys forever), got {ttl!r}", reason="invalid_option")
        fields["max_age"] = seconds
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes == 0 or max_bytes < -1:
            raise InvalidRequestError(f"max_bytes must be a positive integer (or -1: no size bound), got {max_bytes!r}",
                                      reason="invalid_option")
        fields["max_bytes"] = max_bytes
    return fields


async def ensure_ledger_bucket(conn: JetStreamConnection, bucket: str, *, create: bool, history: int,
                               ttl: float | str | timedelta | None, max_bytes: int | None,
                               replication: dict[str, Any]) -> dict[str, Any]:
    """Create the bucket (``create``) or bring it to what the ledger needs; returns its stream config.

    ``ttl``/``max_bytes``/``replication`` given: an existing bucket is changed to them; None: a new bucket
    gets the defaults (``ttl`` :data:`DEFAULT_TTL`) and an existing one keeps its own.
    """
    check_bucket_name(bucket)
    retention = _retention_fields(ttl, max_bytes)
    stream = stream_of(bucket)
    async with kv_errors(conn, bucket, f"ledger bucket {bucket!r}"):
        info = await find_stream(conn, stream)
        if info is None:
            if not create:
                raise LedgerNotFoundError(f"ledger bucket {bucket!r} does not exist; open it with create=True")
            age = retention.get("max_age", DEFAULT_TTL)
            try:
                await create_bucket(conn, replication, bucket=bucket, history=history, ttl=age or None,
                                    max_bytes=retention.get("max_bytes"), description="airflow-jetstream batch ledger")
            except Exception as exc:  # nats-py's error here; kv_errors maps what is raised on
                if getattr(exc, "err_code", None) != _NAME_IN_USE:
                    raise
                # another writer (a Spark write's other partition) created it meanwhile and set what it needs:
                # brought to what the ledger needs below like any existing bucket
            else:
                log.info("Created batch ledger bucket %s with %d replica(s); keys kept %s after their last change",
                         bucket, bucket_replicas(conn, replication), f"{age / 86400:g} d" if age else "forever")
        result = await ensure_stream(conn, {"name": stream, "allow_atomic": True, "allow_direct": True,
                                            **retention, **replication})
    config: dict[str, Any] = result["info"]["config"]
    if info is not None and result["action"] == "updated":
        log.info("Ledger bucket %s updated: %s", bucket, ", ".join(result["changed"]))
    if retention_of(config) == {"ttl": None, "max_bytes": None} and bucket not in _UNBOUNDED_WARNED:
        _UNBOUNDED_WARNED.add(bucket)
        log.warning("Ledger bucket %s keeps every key forever (no ttl, no max_bytes): open it once with "
                    "BatchLedger.open(conn, %r, ttl='30d') to bound it (docs/ledger.md, Retention)", bucket, bucket)
    return config


async def latest(conn: JetStreamConnection, bucket: str,
                 run_id: str | None) -> AsyncGenerator[tuple[int, str, BatchRecord | None], None]:
    """``(seq, key, record)`` of every batch key of ``run_id`` (all runs when None), in stream order; record
    None for a deleted, purged or expired key. A key updated during the read comes again."""
    pattern = f"{key_token(check_id(run_id, 'run_id'))}.*" if run_id is not None else ">"
    prefix = subject_of(bucket, "")
    async with kv_errors(conn, bucket, f"ledger {bucket!r} listing", fail_fast=False):
        async for chunk in read_latest_per_subject(conn, stream_of(bucket), [prefix + pattern]):
            for subject, seq, _, headers, data in chunk:
                key = subject[len(prefix):]
                if is_counts_key(key):
                    continue
                if is_marker(headers):
                    yield seq, key, None
                else:
                    yield seq, key, BatchRecord.decode(data, seq, key)


async def list_batches(conn: JetStreamConnection, bucket: str, run_id: str | None,
                       state: str | None = None) -> list[BatchRecord]:
    """Every batch of ``run_id`` (all runs when None), optionally only those in ``state``, sorted by (run, batch)."""
    records: dict[str, BatchRecord] = {}
    async for _, key, rec in latest(conn, bucket, run_id):
        if rec is None:
            records.pop(key, None)
        else:
            records[key] = rec
    chosen = (r for r in records.values() if state is None or r.state == state)
    return sorted(chosen, key=lambda r: (r.run_id, r.batch_id))


async def iter_batches(conn: JetStreamConnection, bucket: str, run_id: str | None,
                       state: str | None = None) -> AsyncGenerator[BatchRecord, None]:
    """The batches of ``run_id`` (all runs when None) in stream order, holding one read chunk; a batch updated
    while the listing runs can come twice, its newer state last."""
    async with aclosing(latest(conn, bucket, run_id)) as records:
        async for _, _, rec in records:
            if rec is not None and (state is None or rec.state == state):
                yield rec


async def read_counts(conn: JetStreamConnection, bucket: str, run_id: str) -> dict[int, dict[str, Any]] | None:
    """The run's counts shards by number (``{}``: none stored), or None when the bucket cannot be read
    with direct gets (it does not exist, or an older version created it and no writer opened it since)."""
    try:
        entries = await read_last(conn, bucket, [counts_pattern(run_id)])
    except StreamNotFoundError:
        return None
    return shards_of(entries)


async def run_summary(conn: JetStreamConnection, bucket: str, run_id: str, now: float) -> dict[str, Any]:
    """The run's summary (:func:`~.counts.merged`): from its counts in one read; a missing bucket is a run without
    batches."""
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


async def listed_summary(conn: JetStreamConnection, bucket: str, run_id: str, now: float) -> dict[str, Any]:
    """A run's summary from its records, counted while streaming the listing (``counted_by: "listing"``), with
    ``expired_claims`` exact (the listing saw every claim).

    Exact when nothing was written to the bucket since the listing started (every key comes once); else
    counted again from :func:`list_batches` (one record per key held), so no batch is counted twice.
    """
    info = await conn.api_request(f"STREAM.INFO.{stream_of(bucket)}", context=f"ledger {bucket!r}")
    last_seq = int(info["state"].get("last_seq") or 0)
    shards = {n: empty_counts(run_id, n) for n in range(SHARDS)}
    expired = 0
    async with aclosing(latest(conn, bucket, run_id)) as records:
        async for seq, _, rec in records:
            if seq > last_seq:
                break
            if rec is not None:
                count_record(shards[shard_of(rec.batch_id)], rec)
                expired += rec.expired(now)
        else:
            return {**merged(run_id, bucket, shards, now), "expired_claims": expired, "counted_by": "listing"}
    metrics.incr("ledger.summary_relisted")
    return summarized(run_id, bucket, await list_batches(conn, bucket, run_id), now)


async def needs_recount(conn: JetStreamConnection, bucket: str, run_id: str, *, has_record: bool) -> bool:
    """Whether a change of a batch whose counts shard is missing must recount the run first: the batch has a
    record (it was recorded without counts), or the run has no counts at all but has records."""
    if has_record:
        return True
    if await read_last(conn, bucket, [counts_pattern(run_id)]):
        return False  # a run with counts: this batch's shard is simply new
    return await run_recorded(conn, bucket, run_id)


async def recount_run(conn: JetStreamConnection, bucket: str, run_id: str, *, repair: bool,
                      now: Callable[[], float]) -> dict[str, Any]:
    """Compare the run's stored counts with a count of its records; with ``repair`` rewrite the counts from the
    records when they differ (or are missing while records exist).

    Returns ``{"run_id", "bucket", "counted": <summary from the counts>, "recounted": <summary from the records>,
    "drift": {field: {"counted": ..., "recounted": ...}}, "shards": [numbers that differ], "repaired": bool}``.
    """
    for _ in range(REPAIR_ATTEMPTS):
        before = await read_last(conn, bucket, [counts_pattern(run_id)])
        stored = shards_of(before)
        records = await list_batches(conn, bucket, run_id)
        fresh = recounted(run_id, records, stored, now())
        counted_summary = merged(run_id, bucket, stored, now())
        recounted_summary = merged(run_id, bucket, {n: v for n, v in fresh.items() if v["batches"]}, now())
        drift = {name: {"counted": counted_summary[name], "recounted": recounted_summary[name]}
                 for name in _COMPARED if counted_summary[name] != recounted_summary[name]}
        wrong = [n for n in range(SHARDS) if _core(stored.get(n)) != _core(fresh[n])]
        result = {"run_id": run_id, "bucket": bucket, "counted": counted_summary, "recounted": recounted_summary,
                  "drift": drift, "shards": wrong, "repaired": False}
        if not repair or not wrong:
            return result
        # only the shards written are compare-and-set: a change of another subset leaves what is rewritten right
        writes = [Write(counts_key(run_id, n), encode_counts(fresh[n]),
                        before[counts_key(run_id, n)].seq if counts_key(run_id, n) in before else 0)
                  for n in wrong]
        try:
            await write(conn, bucket, writes, context=f"ledger {bucket!r} recount of run {run_id!r}")
        except CasConflict:
            continue  # a writer changed the run meanwhile: count again
        metrics.incr("ledger.counts_repaired")
        log.warning("Ledger %s run %s: counts of shard(s) %s rewritten from the run's %d record(s)%s", bucket,
                    run_id, wrong, len(records), f"; the totals differed in {', '.join(drift)}" if drift else "")
        return {**result, "repaired": True}
    raise LedgerConflictError(f"ledger {bucket!r} run {run_id!r}: the run changed during each of {REPAIR_ATTEMPTS} "
                              "recounts; repair it when its writers are idle")


def _core(value: dict[str, Any] | None) -> tuple[Any, ...]:
    """What a recount compares of a shard (a missing shard is one without batches)."""
    if not value or not value.get("batches"):
        return (0,)
    return (value["batches"], _nonzero(value["states"]), _nonzero(value["messages"]), value.get("attempts", 0),
            sorted(value.get("streams") or []))


def _nonzero(counts: dict[str, int]) -> list[tuple[str, int]]:
    return sorted((state, n) for state, n in counts.items() if n)
