"""The ledger bucket on the wire: the bucket brought to what the ledger needs, the last value of keys in one
direct get, compare-and-set writes of several keys as one atomic batch, the group commit, the listing of a run.

A write names, for each key, the sequence its last value had when it was read (0: the key must not exist); the
server checks all of them when the batch commits (``Nats-Expected-Last-Subject-Sequence`` on each message) and
stores all of it or nothing (nats-server 2.12+: the bucket's stream needs ``allow_atomic`` and, for the reads,
``allow_direct``; a writer's ``BatchLedger.open`` sets both, readers never change the bucket). A moved key is
:class:`CasConflict`. A write that got no answer may or may not be stored: the next read shows, change by change,
whether the record holds exactly what was written; nothing is sent twice blindly.

Group commit: every record change writes its run's counts shard too, so changes to one shard must take turns, and
each atomic batch costs the server. The changes a process makes to one run queue in a lane; one task writes the
queue as atomic batches of up to :data:`GROUP` records plus the counts of the shards they touch (one read, one
commit). Writers in other processes still race: a moved key fails the batch, which is read and decided again.

A run's summary is its counts merged (one direct get); a run recorded before the ledger kept counts is listed
(O(n), ``counted_by: "listing"``). A listing (``last_per_subject`` on ``<run>.*``; markers and counts keys
skipped) serves what needs every record: claiming a whole run, the reaper once a claim may have expired, a
recount, whose repair rewrites the shards that differ, compare-and-set on what was read before the listing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import partial
from typing import Any, Protocol

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.streams import find_stream
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    BatchNotFoundError,
    ClaimLostError,
    InvalidRequestError,
    JetStreamError,
    LedgerConflictError,
    LedgerNotFoundError,
    RequestTimeoutError,
    StreamNotFoundError,
)
from airflow_jetstream.client.kv import keys
from airflow_jetstream.client.kv.bucket import ensure_kv_stream, kv_errors
from airflow_jetstream.client.kv.keys import BUSY, CasConflict, Write, is_marker
from airflow_jetstream.client.kv.names import stream_of
from airflow_jetstream.client.ledger.counts import (
    compared,
    count_record,
    counted,
    decode_counts,
    empty_counts,
    encode_counts,
    merged,
    shards_of,
    summarized,
)
from airflow_jetstream.client.ledger.records import (
    KEY_SAFE,
    SHARDS,
    BatchRecord,
    Entry,
    batch_key,
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
_UNBOUNDED_WARNED: set[str] = set()
#: Repairs one recount tries before giving up while writers keep changing the run.
REPAIR_ATTEMPTS = 5

async def read_last(conn: JetStreamConnection, bucket: str, keys: Sequence[str], *,
                    leader: bool = False) -> dict[str, Entry]:
    """The last value of each key matching ``keys`` (keys and key filters with ``*``/``>``), by key; keys never
    written are absent. One direct get, answered by any replica: one still applying the latest writes may answer
    an older value. ``leader`` (literal keys only) asks the stream leader instead, one message get per key at
    once, for reads that must see every write made before them."""
    prefix = f"$KV.{bucket}."
    if leader:
        found = await asyncio.gather(*(get_message(conn, stream_of(bucket), subject=prefix + key) for key in keys))
        messages = {msg.subject: msg for msg in found if msg is not None}
    else:
        messages = await last_per_subject(conn, stream_of(bucket), [prefix + key for key in keys])
    return {subject[len(prefix):]: Entry(key=subject[len(prefix):], seq=msg.seq, data=msg.data,
                                         deleted=is_marker(msg.headers))
            for subject, msg in messages.items()}


async def run_recorded(conn: JetStreamConnection, bucket: str, run_id: str) -> bool:
    """Whether any batch key of the run is stored (a record, or a delete marker), in one small read."""
    pattern = f"$KV.{bucket}.{key_token(check_id(run_id, 'run_id'))}.*"
    return await get_message(conn, stream_of(bucket), seq=1, subject=pattern, next_after=True, direct=True) is not None


def _missing(where: str) -> JetStreamError:
    return LedgerNotFoundError(f"{where}: the ledger bucket does not exist; open it with create=True")


#: :func:`~airflow_jetstream.client.kv.keys.write` to the ledger's bucket (all or none, each compare-and-set),
#: a missing bucket being :class:`LedgerNotFoundError`.
write = partial(keys.write, missing=_missing)


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
    if not create and await find_stream(conn, stream_of(bucket)) is None:
        raise LedgerNotFoundError(f"ledger bucket {bucket!r} does not exist; open it with create=True")
    age = retention.get("max_age", DEFAULT_TTL)
    result = await ensure_kv_stream(conn, bucket, {"allow_atomic": True, "allow_direct": True, **retention,
                                                   **replication}, context=f"ledger bucket {bucket!r}",
                                    history=history, ttl=age or None, description="airflow-jetstream batch ledger")
    config: dict[str, Any] = result["info"]["config"]
    if result["action"] == "created":
        log.info("Created batch ledger bucket %s with %d replica(s); keys kept %s after their last change",
                 bucket, config.get("num_replicas", 1), f"{age / 86400:g} d" if age else "forever")
    elif result["action"] == "updated":
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
    prefix = f"$KV.{bucket}."
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


async def read_counts(conn: JetStreamConnection, bucket: str, run_id: str, *,
                      leader: bool = False) -> dict[int, dict[str, Any]] | None:
    """The run's counts shards by number (``{}``: none stored), or None when the bucket cannot be read
    with direct gets (it does not exist, or an older version created it and no writer opened it since).
    ``leader``: every shard from the stream leader (:func:`read_last`)."""
    keys = [counts_key(run_id, shard) for shard in range(SHARDS)] if leader else [counts_pattern(run_id)]
    try:
        entries = await read_last(conn, bucket, keys, leader=leader)
    except StreamNotFoundError:
        return None
    return shards_of(entries)


async def run_summary(conn: JetStreamConnection, bucket: str, run_id: str, now: float, *,
                      leader: bool = False) -> dict[str, Any]:
    """The run's summary (:func:`~.counts.merged`): from its counts in one read (``leader``: read from the stream
    leader); a run without counts that has records (or a bucket an older version created: no direct gets) is
    listed; a missing bucket is a run without batches."""
    shards = await read_counts(conn, bucket, run_id, leader=leader)
    if not shards and (shards is None or await run_recorded(conn, bucket, run_id)):
        with contextlib.suppress(StreamNotFoundError):  # no bucket
            return await listed_summary(conn, bucket, run_id, now)
    return merged(run_id, bucket, shards or {}, now)


async def listed_summary(conn: JetStreamConnection, bucket: str, run_id: str, now: float) -> dict[str, Any]:
    """A run's summary counted while streaming its listing, ``expired_claims`` exact (every claim seen). Exact when
    nothing was written since the listing started (every key comes once); else counted again from
    :func:`list_batches` (one record per key), so no batch is counted twice."""
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


async def recount_run(conn: JetStreamConnection, bucket: str, run_id: str, *, repair: bool,
                      now: Callable[[], float]) -> dict[str, Any]:
    """Compare the run's stored counts with a count of its records (:func:`~.counts.compared`); with ``repair``
    rewrite the counts of the shards that differ (or are missing while records exist)."""
    for _ in range(REPAIR_ATTEMPTS):
        before = await read_last(conn, bucket, [counts_pattern(run_id)])
        records = await list_batches(conn, bucket, run_id)
        result, fresh = compared(run_id, bucket, shards_of(before), records, now())
        wrong, drift = result["shards"], result["drift"]
        if not repair or not wrong:
            return result
        # only the shards written are compare-and-set: a change of another subset leaves what is rewritten right
        keyed = {n: counts_key(run_id, n) for n in wrong}
        writes = [Write(key, encode_counts(fresh[n]), before[key].seq if key in before else 0)
                  for n, key in keyed.items()]
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



#: Records written in one atomic batch with their shard (the server allows 1,000 messages per batch).
GROUP = 256
#: Compare-and-set rounds a change may take before giving up (writers of other processes re-read and retry).
CAS_ATTEMPTS = 50

Change = Callable[[BatchRecord | None], BatchRecord | None]


class Ledger(Protocol):
    """What the group commit needs of a ledger (``BatchLedger``): its bucket, its clock, how it reads keys."""

    conn: JetStreamConnection
    bucket: str
    clock: Callable[[], float]

    async def read_entries(self, keys: list[str], *, leader: bool = False) -> dict[str, Entry]: ...


@dataclass(eq=False)
class Pending:
    """One change waiting in a lane; ``done`` gets (record, changed) or the change's error."""

    run_id: str
    batch_id: str
    change: Change
    creates: bool
    done: asyncio.Future[tuple[BatchRecord, bool]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    #: What each unanswered write put under ``key``: one found there on a later read was stored. All of them are
    #: kept: each was conditioned on the revision its read saw, so at most one can be stored, possibly an earlier
    #: one (a write that timed out can commit late, after the next try met no stream leader).
    unanswered: list[bytes] = field(default_factory=list)
    attempts: int = 0

    def __post_init__(self) -> None:
        self.key = batch_key(self.run_id, self.batch_id)
        self.shard = shard_of(self.batch_id)
        self.ckey = counts_key(self.run_id, self.shard)


@dataclass(eq=False)
class Lane:
    queue: list[Pending] = field(default_factory=list)
    worker: asyncio.Task[None] | None = None


_LANES: weakref.WeakKeyDictionary[JetStreamConnection, dict[tuple[str, str], Lane]] = weakref.WeakKeyDictionary()


async def apply(ledger: Ledger, run_id: str, batch_id: str, change: Change, *,
                creates: bool = False) -> tuple[BatchRecord, bool]:
    """Apply ``change`` to the batch's current record (None: not recorded) and its run's counts, as one atomic
    compare-and-set write shared with this process's other changes of the same run (queued in the run's lane).
    ``change`` returns the new record, or None to leave it; returns (record, changed)."""
    item = Pending(run_id=run_id, batch_id=batch_id, change=change, creates=creates)
    lanes = _LANES.setdefault(ledger.conn, {})
    lane = lanes.setdefault((ledger.bucket, item.run_id), Lane())
    lane.queue.append(item)
    if lane.worker is None:
        lane.worker = asyncio.get_running_loop().create_task(_drain(ledger, (ledger.bucket, item.run_id), lane,
                                                                    lanes))
    return await asyncio.shield(item.done)


async def _drain(ledger: Ledger, name: tuple[str, str], lane: Lane, lanes: dict[tuple[str, str], Lane]) -> None:
    try:
        while lane.queue:
            group: list[Pending] = []
            keys: set[str] = set()
            for item in list(lane.queue):  # one change per key per batch: a second one waits for the next
                if len(group) < GROUP and item.key not in keys:
                    group.append(item)
                    keys.add(item.key)
                    lane.queue.remove(item)
            try:
                await _commit(ledger, group)
            except BaseException as exc:  # handed to every waiting caller, which raises it
                for item in group:
                    _settle(item, exc)
                if not isinstance(exc, Exception):
                    raise
    finally:  # the lane goes: a later change starts a new one
        del lanes[name]
        for item in lane.queue:
            _settle(item, LedgerConflictError("the ledger writer of this run stopped; retry the change"))


def _settle(item: Pending, outcome: tuple[BatchRecord, bool] | BaseException) -> None:
    if item.done.done():
        return
    if isinstance(outcome, BaseException):
        item.done.set_exception(outcome)
    else:
        item.done.set_result(outcome)


async def _commit(ledger: Ledger, group: list[Pending]) -> None:
    """Write ``group``'s changes and the counts of the shards they touch as atomic batches until each is settled."""
    conn, bucket = ledger.conn, ledger.bucket
    silent_since: float | None = None
    leader = False  # a replica answers first; after a refused write, or to refuse a change, the leader (a replica
    # may be catching up: what it lacks is no reason to refuse)
    while group:
        ckeys = sorted({item.ckey for item in group})
        found = await ledger.read_entries([item.key for item in group] + ckeys, leader=leader)
        missing = {ckey for ckey in ckeys if ckey not in found or found[ckey].deleted}
        if missing and await _recounted(ledger, [item for item in group if item.ckey in missing], found):
            continue
        counts = {ckey: None if ckey in missing else decode_counts(found[ckey].data, ckey, found[ckey].seq)
                  for ckey in ckeys}
        writes: list[Write] = []
        written: list[tuple[Pending, BatchRecord]] = []
        replica = conn.clustered and not leader  # what a replica's read refuses or leaves alone, the leader decides
        for item in group:
            entry = found.get(item.key)
            current = None if entry is None or entry.deleted else BatchRecord.decode(entry.data, entry.seq, item.key)
            try:
                if current is not None and entry is not None and entry.data in item.unanswered:
                    _settle(item, (current, True))  # the unanswered write was stored
                    continue
                if current is None and not item.creates:
                    raise BatchNotFoundError(f"ledger {bucket!r} batch {item.batch_id!r} of run {item.run_id!r}: "
                                             "not recorded; record() it after publishing")
                new = item.change(current)
                if new is None:
                    if not replica:
                        _settle(item, (current, False) if current is not None else
                                LedgerConflictError(f"batch {item.batch_id!r}: nothing to write"))
                    continue
                payload = new.encode()
                counts[item.ckey] = counted(counts[item.ckey], item.run_id, item.shard, current, new, ledger.clock())
            except Exception as exc:  # this change's own error (e.g. ClaimLostError) is its caller's
                if not (replica and isinstance(exc, BatchNotFoundError | ClaimLostError)):  # a replica may lag
                    _settle(item, exc)
                continue
            writes.append(Write(item.key, payload, entry.seq if entry else 0))
            written.append((item, new))
        group = [item for item in group if not item.done.done()]
        if len(group) > len(written):  # left to the leader: it decides the whole group again
            leader = True
            continue
        if not group:
            return
        touched = {item.ckey: counts[item.ckey] for item in group}  # each counted its change in its shard
        writes += [Write(ckey, encode_counts(value), found[ckey].seq if ckey in found else 0)
                   for ckey, value in sorted(touched.items()) if value is not None]
        try:
            last = await write(conn, bucket, writes, context=f"ledger {bucket!r} run {group[0].run_id!r}")
        except CasConflict:
            metrics.incr("ledger.cas_retry")
            leader = conn.clustered
            _count_attempt(group, bucket)
            await asyncio.sleep(BUSY.pause(group[0].attempts) if group else 0.0)
            continue
        except RequestTimeoutError:
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since > conn.settings.leader_wait:
                raise
            for (item, _), sent in zip(written, writes, strict=False):
                item.unanswered.append(sent.data)
            continue
        first = last - len(writes) + 1
        for number, (item, new) in enumerate(written):
            _settle(item, (replace(new, revision=first + number), True))
        return


async def _recounted(ledger: Ledger, group: list[Pending], found: Mapping[str, Entry]) -> bool:
    """Recount the run first when ``group``'s shards are missing and the run was recorded without counts (a batch
    of the group has a record, or the run has records but no counts at all); True when the recount rewrote counts
    (read again), False when the shards are simply new."""
    conn, bucket, run_id = ledger.conn, ledger.bucket, group[0].run_id
    has_record = any(item.key in found and not found[item.key].deleted for item in group)
    if not has_record and (await read_last(conn, bucket, [counts_pattern(run_id)])
                           or not await run_recorded(conn, bucket, run_id)):
        return False  # a run with counts (this shard is simply new), or a new run
    recount = await recount_run(conn, bucket, run_id, repair=True, now=ledger.clock)
    if not recount["repaired"]:
        return False  # the records and the counts agree: nothing of this shard was recorded without counts
    _count_attempt(group, ledger.bucket)
    return True


def _count_attempt(group: list[Pending], bucket: str) -> None:
    for item in group:
        item.attempts += 1
        if item.attempts >= CAS_ATTEMPTS:
            _settle(item, LedgerConflictError(
                f"ledger {bucket!r} batch {item.batch_id!r} of run {item.run_id!r}: changed concurrently "
                f"{CAS_ATTEMPTS} times in a row; retry later"))
    group[:] = [item for item in group if not item.done.done()]
