"""Batch ledger: the state of every batch of a run in a KV bucket, changed only by compare-and-set, with the
run's counts kept beside the records so a look at a run costs the same for 10 batches or 1,000,000.

JetStream carries the data; the ledger (KV bucket ``batch_ledger`` by default) carries one entry per
batch of a run: where the batch is (stream, sequence range, message count), its state, how many
consume attempts it took, timestamps and the last error. Every change writes the record and its run's
counts (:mod:`~airflow_jetstream.client.ledger.counts`) as one atomic batch, each compare-and-set on its
revision: two processes can never both move the same batch, and the counts never miss a change.

States::

    published --claim--> in_progress --mark_consumed--> consumed
        ^                     |
        +--- release / reap --+     while attempts < max_attempts
                              +---> failed (dead letter: attempts >= max_attempts, reported, kept)

A claim holds a batch for ``visibility_timeout``. A consumer that dies never marks its batch: once
the timeout has passed, :meth:`BatchLedger.reap` (or the next :meth:`BatchLedger.claim`) returns
it to ``published`` for the next attempt, or moves it to ``failed`` when it already had
``max_attempts`` attempts. Deadlines use the wall clocks of the claimer and the reaper: keep the
visibility timeout far above the clock skew of your hosts.

Writer side (a Spark partition, after the server acknowledged its atomic batch)::

    async with open_connection(settings) as conn:
        ledger = await BatchLedger.open(conn)
        if await ledger.get(run_id, batch_id) is None:      # a re-run skips stored batches
            ack = ...                                        # publish the batch, get its PubAck
            await ledger.record(run_id, batch_id, stream="ORDERS", count=ack.batch_size,
                                first_seq=ack.seq - ack.batch_size + 1, last_seq=ack.seq)

Reader side (a Spark task that owns one batch)::

    ledger = await BatchLedger.open(conn, visibility_timeout="10m", max_attempts=3)
    batch = await ledger.claim(run_id, batch_id, owner=f"{app_id}/task-{task_id}")
    if batch is None:
        return                                  # another attempt holds it or it is already done
    try:
        write_output(read_range(batch.stream, batch.first_seq, batch.last_seq))  # idempotent output
    except Exception as exc:
        await ledger.release(batch, error=str(exc))   # back to published, or failed at max attempts
        raise
    await ledger.mark_consumed(batch)           # only after the output is written

Airflow waits with ``await ledger.wait_all(run_id, "consumed")`` (the JetStreamBatchLedgerSensor).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from datetime import timedelta
from functools import partial
from typing import Any

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.streams import replication_config
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    InvalidRequestError,
    LedgerConflictError,
    LedgerNotFoundError,
    LedgerWaitTimeoutError,
    StreamNotFoundError,
)
from airflow_jetstream.client.ledger import listing, reaper
from airflow_jetstream.client.ledger.bucket import check_bucket_name, ensure_ledger_bucket, retention_of
from airflow_jetstream.client.ledger.counts import counts_key, shard_of
from airflow_jetstream.client.ledger.lanes import Change, Pending, submit
from airflow_jetstream.client.ledger.records import (
    CONSUMED,
    DEFAULT_BUCKET,
    FAILED,
    IN_PROGRESS,
    PUBLISHED,
    STATES,
    WAITABLE_STATES,
    BatchRecord,
    batch_key,
    iso_time,
)
from airflow_jetstream.client.ledger.recount import recount_run
from airflow_jetstream.client.ledger.status import run_summary
from airflow_jetstream.client.ledger.store import Entry, read_last
from airflow_jetstream.client.ledger.summary import check_waitable_state, count_reached, run_reached
from airflow_jetstream.client.ledger.transitions import (
    check_location,
    claimed,
    extended,
    marked_consumed,
    released,
    reopened,
    report_transition,
)
from airflow_jetstream.client.subjects import validate_name

#: Claims (or settlings) in flight at once in :meth:`BatchLedger.claim_available` and :meth:`BatchLedger.settle`.
CLAIM_WINDOW = 256


class BatchLedger:
    """The batch ledger of one KV bucket. Build it with :meth:`open` (a reader that never changes the bucket,
    such as a sensor, may build it directly: ``BatchLedger(conn, bucket)``).

    :param visibility_timeout: how long a claim holds a batch (seconds, ``"10m"`` or a timedelta).
    :param max_attempts: consume attempts per batch before it goes to ``failed``.
    :param clock: seconds since the epoch (``time.time``); tests pass a controllable clock.
    """

    def __init__(self, conn: JetStreamConnection, bucket: str = DEFAULT_BUCKET, *,
                 visibility_timeout: float | str | timedelta = "10m", max_attempts: int = 3,
                 clock: Callable[[], float] = time.time, config: dict[str, Any] | None = None) -> None:
        self.conn = conn
        self.bucket = check_bucket_name(bucket)
        seconds = to_seconds(visibility_timeout, field="visibility_timeout")
        if seconds <= 0:
            raise InvalidRequestError(f"visibility_timeout must be positive, got {visibility_timeout!r}")
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise InvalidRequestError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        self.visibility_timeout = float(seconds)
        self.max_attempts = max_attempts
        self.clock = clock
        #: The bucket's stream config as :meth:`open` left it (None when built directly).
        self.config = config

    @classmethod
    async def open(cls, conn: JetStreamConnection, bucket: str = DEFAULT_BUCKET, *, create: bool = True,
                   history: int = 1, ttl: float | str | timedelta | None = None, max_bytes: int | None = None,
                   replicas: int | None = None, placement: dict[str, Any] | None = None,
                   visibility_timeout: float | str | timedelta = "10m", max_attempts: int = 3,
                   clock: Callable[[], float] = time.time) -> BatchLedger:
        """Open the ledger bucket, creating it when missing (``create``), ready for writing.

        ``ttl``: how long a key is kept after its last change (seconds, ``"30d"``; 0: forever);
        ``max_bytes``: a size bound (-1: none). Unset, a new bucket keeps keys 30 days and has no size bound,
        and an existing bucket keeps its own; set, an existing bucket is changed to them. ``replicas`` (1-5)
        and ``placement`` (``{"cluster": ..., "tags": [...]}``) likewise: a new bucket gets 3 replicas on a
        cluster (else 1). A bucket an older version created gets ``allow_atomic`` and ``allow_direct``.
        """
        config = await ensure_ledger_bucket(conn, bucket, create=create, history=history, ttl=ttl,
                                            max_bytes=max_bytes, replication=replication_config(replicas, placement))
        return cls(conn, bucket, visibility_timeout=visibility_timeout, max_attempts=max_attempts, clock=clock,
                   config=config)

    async def prepare(self) -> None:
        """Make sure the bucket can take this ledger's writes (what :meth:`open` does), once: a ledger built
        directly for reading calls it before its first write (the reaper of a sensor that reaps)."""
        if self.config is None:
            self.config = await ensure_ledger_bucket(self.conn, self.bucket, create=False, history=1, ttl=None,
                                                     max_bytes=None, replication={})

    @property
    def retention(self) -> dict[str, Any] | None:
        """``{"ttl": seconds or None, "max_bytes": bytes or None}`` (None: no bound) as :meth:`open` found it."""
        return retention_of(self.config) if self.config is not None else None

    # reading

    async def get(self, run_id: str, batch_id: str) -> BatchRecord | None:
        """The batch's current record, or None when it was never recorded."""
        key = batch_key(run_id, batch_id)
        entry = (await self.read_entries([key])).get(key)
        if entry is None or entry.deleted:
            return None
        return BatchRecord.decode(entry.data, entry.seq, key)

    async def get_many(self, run_id: str, batch_ids: Iterable[str], *, leader: bool = False) -> dict[str, BatchRecord]:
        """The records of the given batches of a run that exist, by batch id, in one request (keep it to a few
        hundred ids per call). ``leader``: read from the stream leader (one get per id, at once), which has every
        write made before; any replica may answer otherwise, and one that is catching up may miss recent ones."""
        keys = {batch_key(run_id, batch_id): batch_id for batch_id in batch_ids}
        found = await self.read_entries(list(keys), leader=leader)
        return {keys[key]: BatchRecord.decode(entry.data, entry.seq, key)
                for key, entry in found.items() if not entry.deleted}

    async def batches(self, run_id: str | None = None, *, state: str | None = None) -> list[BatchRecord]:
        """Every batch of ``run_id`` (of all runs when None), optionally only those in ``state``, sorted.

        Lists the run (O(n)); :meth:`summary` reads its counts instead. :meth:`iter_batches` streams them.
        """
        return await listing.list_batches(self.conn, self.bucket, run_id, state)

    def iter_batches(self, run_id: str | None = None, *,
                     state: str | None = None) -> AsyncGenerator[BatchRecord, None]:
        """Stream the batches of ``run_id`` (all runs when None) in stream order, holding one read chunk.

        A batch updated while the listing runs can come twice, its newer state last.
        """
        return listing.iter_batches(self.conn, self.bucket, run_id, state)

    async def summary(self, run_id: str) -> dict[str, Any]:
        """Counts of a run's batches and messages by state, plus the failed (dead-letter) batches: one read of
        the run's counts (``counted_by: "counts"``), or a listing for a run recorded before the ledger kept
        counts (``counted_by: "listing"``)."""
        return await run_summary(self.conn, self.bucket, run_id, self.clock())

    async def recount(self, run_id: str, *, repair: bool = False) -> dict[str, Any]:
        """Count a run's records (a listing) and compare with its stored counts; with ``repair`` the counts
        are rewritten from the records where they differ (see :mod:`airflow_jetstream.client.ledger.recount`)."""
        return await recount_run(self.conn, self.bucket, run_id, repair=repair, now=self.clock)

    # writing

    async def record(self, run_id: str, batch_id: str, *, stream: str, count: int,
                     first_seq: int | None = None, last_seq: int | None = None,
                     meta: dict[str, Any] | None = None) -> BatchRecord:
        """Record a published batch (state ``published``). Idempotent: recording the same batch
        again returns the stored record unchanged, whatever its state; a different location for an
        existing batch raises :class:`LedgerConflictError`."""
        validate_name(stream, what="stream name")
        check_location(count, first_seq, last_seq)
        try:
            json.dumps(meta)
        except (TypeError, ValueError):
            raise InvalidRequestError(f"meta of batch {batch_id!r} must be JSON-able (dict of str, numbers, lists)") \
                from None
        now = iso_time(self.clock())
        rec = BatchRecord(run_id=run_id, batch_id=batch_id, stream=stream, count=count, first_seq=first_seq,
                          last_seq=last_seq, created_at=now, updated_at=now, meta=dict(meta or {}))
        rec.encode()  # refuse a record the schema refuses before anything is read
        stored, changed = await self._apply(run_id, batch_id, lambda current: rec if current is None else None,
                                            creates=True)
        if changed:
            metrics.incr("ledger.recorded", tags={"stream": stream})
            return stored
        wanted = (stream, count, first_seq, last_seq)
        existing = (stored.stream, stored.count, stored.first_seq, stored.last_seq)
        if wanted != existing:
            raise LedgerConflictError(
                f"batch {batch_id!r} of run {run_id!r} is already recorded as {existing} "
                f"(stream, count, first_seq, last_seq), not {wanted}; batch ids must be deterministic per "
                "run, so this is another batch reusing the id: use a distinct batch id",
            )
        return stored

    async def claim(self, run_id: str, batch_id: str, *, owner: str | None = None) -> BatchRecord | None:
        """Claim a batch for one consume attempt: ``published`` -> ``in_progress`` until the
        visibility deadline. Returns the claimed record (pass it to :meth:`mark_consumed`), or None
        when another attempt holds it, it is consumed or failed. Exactly one of racing claimers wins.
        An expired claim is treated as a dead attempt first (as :meth:`reap` would)."""
        take = partial(claimed, now=self.clock(), owner=owner, visibility_timeout=self.visibility_timeout,
                       max_attempts=self.max_attempts)
        rec, changed = await self._apply(run_id, batch_id, take)
        if changed and rec.state == IN_PROGRESS:
            metrics.incr("ledger.claimed", tags={"stream": rec.stream})
            return rec
        if changed:
            report_transition(rec)  # the expired attempt was the last one: the dead letter is stored
        return None

    async def claim_available(self, run_id: str, *, owner: str | None = None,
                              limit: int | None = None) -> list[BatchRecord]:
        """Claim up to ``limit`` claimable batches of a run (published, or with an expired claim), in batch id
        order. Lists the run once and claims many at a time (the claims of one counts shard share a write)."""
        now = self.clock()
        candidates = [rec.batch_id for rec in await self.batches(run_id) if rec.state == PUBLISHED or rec.expired(now)]
        taken: list[BatchRecord] = []
        while candidates and (limit is None or len(taken) < limit):
            size = CLAIM_WINDOW if limit is None else min(CLAIM_WINDOW, limit - len(taken))
            window, candidates = candidates[:size], candidates[size:]
            got = await asyncio.gather(*(self.claim(run_id, batch_id, owner=owner) for batch_id in window))
            taken.extend(rec for rec in got if rec is not None)
        return taken

    async def settle(self, claims: Iterable[BatchRecord], *, error: str | None = None) -> list[BatchRecord]:
        """:meth:`mark_consumed` every claim (``error`` None), or :meth:`release` each with ``error``; many at once."""
        held = list(claims)
        done: list[BatchRecord] = []
        for start in range(0, len(held), CLAIM_WINDOW):
            window = held[start:start + CLAIM_WINDOW]
            done.extend(await asyncio.gather(*(self.mark_consumed(c) if error is None else self.release(c, error=error)
                                               for c in window)))
        return done

    async def extend(self, claim: BatchRecord) -> BatchRecord:
        """Push the visibility deadline of a held claim forward (long processing)."""
        push = partial(extended, claim=claim, now=self.clock(), visibility_timeout=self.visibility_timeout)
        rec, _ = await self._apply(claim.run_id, claim.batch_id, push)
        return rec

    async def mark_consumed(self, claim: BatchRecord) -> BatchRecord:
        """``in_progress`` -> ``consumed`` for a claim this caller holds. Call it only after the
        output is written. Idempotent for the same claim; :class:`ClaimLostError` if the claim was
        reaped (the batch will be consumed again: keep outputs idempotent per batch)."""
        finish = partial(marked_consumed, claim=claim, now=self.clock())
        rec, changed = await self._apply(claim.run_id, claim.batch_id, finish)
        if changed:
            metrics.incr("ledger.consumed", tags={"stream": rec.stream})
        return rec

    async def release(self, claim: BatchRecord, *, error: str) -> BatchRecord:
        """Give up a held claim after a failed attempt: back to ``published`` for the next attempt,
        or ``failed`` when the batch had ``max_attempts`` attempts. ``error`` is kept as last_error."""
        give_up = partial(released, claim=claim, now=self.clock(), error=error, max_attempts=self.max_attempts)
        rec, _ = await self._apply(claim.run_id, claim.batch_id, give_up)
        report_transition(rec)
        return rec

    async def reap(self, run_id: str | None = None) -> dict[str, Any]:
        """Return expired claims of ``run_id`` (all runs when None) to ``published``, or move them to
        ``failed`` past max attempts. Returns ``{"returned": [...], "failed": [...], "returned_count": n,
        "failed_count": m}``: the counts cover every reaped batch, the lists the first 100 records (as dicts).

        Reads the run's counts first: while no claim of the run can have expired yet, that is all it does.
        """
        return await reaper.reap(self, run_id)

    async def requeue(self, run_id: str, *, batch_ids: Iterable[str] | None = None,
                      states: Iterable[str] = (FAILED,)) -> list[BatchRecord]:
        """Put batches back to ``published`` with a fresh attempt count: dead letters after the cause
        was fixed (default), or ``states=("consumed", "failed")`` to consume a run again (replay)."""
        wanted_states = set(states)
        unknown = wanted_states - set(STATES)
        if unknown:
            raise InvalidRequestError(f"unknown state(s) {sorted(unknown)}; use {', '.join(STATES)}")
        if batch_ids is None:
            summary = await self.summary(run_id)
            if not any(summary["states"].get(state) for state in wanted_states):
                return []
            ids = [rec.batch_id for rec in await self.batches(run_id) if rec.state in wanted_states]
        else:
            ids = list(batch_ids)
        reopen = partial(reopened, now=self.clock(), states=wanted_states)
        requeued = []
        for batch_id in ids:
            rec, changed = await self._apply(run_id, batch_id, reopen)
            if changed:
                requeued.append(rec)
        return requeued

    async def wait_all(self, run_id: str, state: str = CONSUMED, *, min_batches: int = 1,
                       timeout: float | None = None, poll_interval: float = 2.0, reap: bool = False,
                       fail_on_failed: bool = True) -> dict[str, Any]:
        """Poll until at least ``min_batches`` batches of the run exist and all reached ``state``;
        returns the run's summary. With ``reap`` expired claims are reaped on every poll. Raises
        :class:`BatchesFailedError` as soon as a batch failed (unless ``fail_on_failed`` is False) and
        :class:`LedgerWaitTimeoutError` after ``timeout`` seconds."""
        check_waitable_state(state)
        timeout = None if timeout is None else to_seconds(timeout, field="timeout")
        poll_interval = to_seconds(poll_interval, field="poll_interval")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if reap:
                await self.reap(run_id)
            summary = await self.summary(run_id)
            if run_reached(summary, state, min_batches=min_batches, fail_on_failed=fail_on_failed):
                return summary
            if deadline is not None and time.monotonic() >= deadline:
                raise LedgerWaitTimeoutError(
                    f"run {run_id!r}: not all batches {state} after {timeout}s "
                    f"({summary['batches']} batch(es), by state {summary['states']}, at least {min_batches} "
                    "expected); check that the consume job runs and that expired claims get reaped"
                )
            await asyncio.sleep(poll_interval if deadline is None else
                                max(0.0, min(poll_interval, deadline - time.monotonic())))

    # internals

    async def read_entries(self, keys: list[str], *, leader: bool = False) -> dict[str, Entry]:
        """The last value of ledger keys (batch records, counts shards, filters of them), by key, in one request;
        ``leader``: from the stream leader, literal keys only (:func:`~.store.read_last`)."""
        try:
            return await read_last(self.conn, self.bucket, keys, leader=leader)
        except StreamNotFoundError:
            raise LedgerNotFoundError(
                f"ledger bucket {self.bucket!r} does not exist, or does not allow direct gets (a bucket an older "
                "version created): open it with BatchLedger.open(conn, bucket)") from None

    async def _apply(self, run_id: str, batch_id: str, change: Change, *,
                     creates: bool = False) -> tuple[BatchRecord, bool]:
        """Apply ``change`` to the batch's current record (None: not recorded) and its run's counts, as one
        atomic compare-and-set write shared with this process's other changes of the same run
        (:mod:`~airflow_jetstream.client.ledger.lanes`). ``change`` returns the new record, or None to leave it;
        returns (record, changed)."""
        shard = shard_of(batch_id)
        item = Pending(run_id=run_id, batch_id=batch_id, key=batch_key(run_id, batch_id), shard=shard,
                       ckey=counts_key(run_id, shard), change=change, creates=creates)
        return await submit(self, item)


__all__ = [
    "CONSUMED",
    "DEFAULT_BUCKET",
    "FAILED",
    "IN_PROGRESS",
    "PUBLISHED",
    "STATES",
    "WAITABLE_STATES",
    "BatchLedger",
    "BatchRecord",
    "batch_key",
    "check_waitable_state",
    "count_reached",
    "run_reached",
]
