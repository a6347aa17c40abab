"""Batch ledger: the state of every batch of a run in a KV bucket, changed only by compare-and-set, with the
run's counts kept beside the records so a look at a run costs the same for 10 batches or 1,000,000
(docs/ledger.md has the states, the record and the examples).

Every change writes the record and its run's counts shard as one atomic batch, each compare-and-set on its
revision (the group commit, :func:`~airflow_jetstream.client.ledger.store.apply`): two processes can never both
move the same batch, and the counts never miss a change.

A claim holds a batch for ``visibility_timeout``; deadlines are set and judged by the server's clock
(:class:`~airflow_jetstream.client.durations.ServerClock`), never a host's, so a host whose clock is skewed neither
takes over a live claim nor keeps one past its deadline. A consumer that dies never marks its batch: once its
deadline passed, :meth:`BatchLedger.reap` (or the next :meth:`BatchLedger.claim`) returns it to ``published``,
or moves it to ``failed`` at ``max_attempts``. A claim is a token: every later change by its holder is a
compare-and-set made only while the batch is still held by that claim (one ``claim_id`` over all its tries), so
a holder frozen past its deadline gets :class:`ClaimLostError` and changes nothing of its successor's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from datetime import timedelta
from functools import partial
from typing import Any

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.streams import find_stream, replication_config
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import ServerClock, to_seconds
from airflow_jetstream.client.errors import (
    InvalidRequestError,
    LedgerConflictError,
    LedgerNotFoundError,
    LedgerWaitTimeoutError,
    StreamNotFoundError,
)
from airflow_jetstream.client.kv.keys import CasConflict, Write
from airflow_jetstream.client.kv.names import stream_of
from airflow_jetstream.client.ledger import store
from airflow_jetstream.client.ledger.counts import (
    MAX_LISTED,
    check_waitable_state,
    due_shards,
    earliest,
    encode_counts,
    run_reached,
    shards_of,
)
from airflow_jetstream.client.ledger.records import (
    CONSUMED,
    DEFAULT_BUCKET,
    FAILED,
    IN_PROGRESS,
    PUBLISHED,
    STATES,
    BatchRecord,
    Entry,
    batch_key,
    check_location,
    claimed,
    counts_key,
    ended,
    extended,
    iso_time,
    marked_consumed,
    reopened,
    report_transition,
    shard_of,
)
from airflow_jetstream.client.subjects import validate_name

#: Claims (or settlings) in flight at once in :meth:`BatchLedger.claim_available` and :meth:`BatchLedger.settle`.
CLAIM_WINDOW = 256
_SETTLE_ATTEMPTS = 5


class BatchLedger:
    """The batch ledger of one KV bucket. Build it with :meth:`open` (a reader that never changes the bucket,
    such as a sensor, may build it directly: ``BatchLedger(conn, bucket)``).

    :param visibility_timeout: how long a claim holds a batch (seconds, ``"10m"`` or a timedelta).
    :param max_attempts: consume attempts per batch before it goes to ``failed``.
    :param clock: seconds since the epoch; by default the server's clock
        (:class:`~airflow_jetstream.client.durations.ServerClock`), so that no host's clock decides when a claim
        expired; tests pass a controllable clock.
    """

    def __init__(self, conn: JetStreamConnection, bucket: str = DEFAULT_BUCKET, *,
                 visibility_timeout: float | str | timedelta = "10m", max_attempts: int = 3,
                 clock: Callable[[], float] | None = None, config: dict[str, Any] | None = None) -> None:
        self.conn = conn
        self.bucket = store.check_bucket_name(bucket)
        seconds = to_seconds(visibility_timeout, field="visibility_timeout")
        if seconds <= 0:
            raise InvalidRequestError(f"visibility_timeout must be positive, got {visibility_timeout!r}")
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise InvalidRequestError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        self.visibility_timeout = float(seconds)
        self.max_attempts = max_attempts
        self.clock = clock or ServerClock()
        #: The bucket's stream config as :meth:`open` left it (None when built directly).
        self.config = config

    @classmethod
    async def open(cls, conn: JetStreamConnection, bucket: str = DEFAULT_BUCKET, *, create: bool = True,
                   history: int = 1, ttl: float | str | timedelta | None = None, max_bytes: int | None = None,
                   replicas: int | None = None, placement: dict[str, Any] | None = None,
                   visibility_timeout: float | str | timedelta = "10m", max_attempts: int = 3,
                   clock: Callable[[], float] | None = None) -> BatchLedger:
        """Open the ledger bucket, creating it when missing (``create``), ready for writing.

        ``ttl``: how long a key is kept after its last change (seconds, ``"30d"``; 0: forever);
        ``max_bytes``: a size bound (-1: none). Unset, a new bucket keeps keys 30 days and has no size bound,
        and an existing bucket keeps its own; set, an existing bucket is changed to them. ``replicas`` (1-5)
        and ``placement`` (``{"cluster": ..., "tags": [...]}``) likewise: a new bucket gets 3 replicas on a
        cluster (else 1). A bucket an older version created gets ``allow_atomic`` and ``allow_direct``.
        """
        config = await store.ensure_ledger_bucket(conn, bucket, create=create, history=history, ttl=ttl,
                                            max_bytes=max_bytes, replication=replication_config(replicas, placement))
        return cls(conn, bucket, visibility_timeout=visibility_timeout, max_attempts=max_attempts, clock=clock,
                   config=config)

    async def prepare(self) -> None:
        """Make sure the bucket can take this ledger's writes (what :meth:`open` does), once: a ledger built
        directly for reading calls it before its first write (the reaper of a sensor that reaps)."""
        if self.config is None:
            self.config = await store.ensure_ledger_bucket(self.conn, self.bucket, create=False, history=1, ttl=None,
                                                     max_bytes=None, replication={})

    @property
    def retention(self) -> dict[str, Any] | None:
        """``{"ttl": seconds or None, "max_bytes": bytes or None}`` (None: no bound) as :meth:`open` found it."""
        return store.retention_of(self.config) if self.config is not None else None

    # reading

    async def get(self, run_id: str, batch_id: str) -> BatchRecord | None:
        """The batch's current record, or None when it was never recorded."""
        return (await self.get_many(run_id, [batch_id])).get(batch_id)

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
        return await store.list_batches(self.conn, self.bucket, run_id, state)

    async def iter_batches(self, run_id: str | None = None, *,
                           state: str | None = None) -> AsyncGenerator[BatchRecord, None]:
        """Stream the batches of ``run_id`` (all runs when None) in stream order, holding one read chunk.

        A batch updated while the listing runs can come twice, its newer state last.
        """
        async with aclosing(store.latest(self.conn, self.bucket, run_id)) as records:
            async for _, _, rec in records:
                if rec is not None and (state is None or rec.state == state):
                    yield rec

    async def summary(self, run_id: str, *, leader: bool = False) -> dict[str, Any]:
        """Counts of a run's batches and messages by state, plus the failed (dead-letter) batches: one read of
        the run's counts (``counted_by: "counts"``), or a listing for a run recorded before the ledger kept
        counts (``counted_by: "listing"``). The counts come from any replica, one still applying the latest
        writes among them; ``leader`` reads them from the stream leader, for a decision that must see every
        change made before it."""
        return await store.run_summary(self.conn, self.bucket, run_id, self.clock(), leader=leader)

    async def recount(self, run_id: str, *, repair: bool = False) -> dict[str, Any]:
        """Count a run's records (a listing) and compare with its stored counts; with ``repair`` the counts
        are rewritten from the records where they differ (see :mod:`airflow_jetstream.client.ledger.counts`)."""
        return await store.recount_run(self.conn, self.bucket, run_id, repair=repair, now=self.clock)

    # writing

    async def record(self, run_id: str, batch_id: str, *, stream: str, count: int,
                     first_seq: int | None = None, last_seq: int | None = None,
                     meta: dict[str, Any] | None = None) -> BatchRecord:
        """Record a published batch (state ``published``). Idempotent: recording the same batch
        again returns the stored record unchanged, whatever its state; a different location for an
        existing batch raises :class:`LedgerConflictError`."""
        validate_name(stream, what="stream name")
        check_location(count, first_seq, last_seq)
        now = iso_time(self.clock())
        rec = BatchRecord(run_id=run_id, batch_id=batch_id, stream=stream, count=count, first_seq=first_seq,
                          last_seq=last_seq, created_at=now, updated_at=now, meta=dict(meta or {}))
        try:
            rec.encode()  # refuse a record the schema refuses before anything is read
        except (TypeError, ValueError):
            raise InvalidRequestError(f"meta of batch {batch_id!r} must be JSON-able (dict of str, numbers, lists)") \
                from None
        stored, changed = await store.apply(self, run_id, batch_id, lambda current: rec if current is None else None,
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
        # One claim id for every try of this claim: a try whose write got no answer but was stored shows on
        # the next read as the batch in progress under this id, which is this claim, not another attempt's.
        claim_id = uuid.uuid4().hex
        take = partial(claimed, now=await self._now(), owner=owner, visibility_timeout=self.visibility_timeout,
                       max_attempts=self.max_attempts, claim_id=claim_id)
        rec, changed = await store.apply(self, run_id, batch_id, take)
        if rec.state == IN_PROGRESS and rec.claim_id == claim_id:
            if changed:
                metrics.incr("ledger.claimed", tags={"stream": rec.stream})
            return rec
        if changed:
            report_transition(rec)  # the expired attempt was the last one: the dead letter is stored
        return None

    async def claim_available(self, run_id: str, *, owner: str | None = None,
                              limit: int | None = None) -> list[BatchRecord]:
        """Claim up to ``limit`` claimable batches of a run (published, or with an expired claim), in batch id
        order. Lists the run once and claims many at a time (the claims of one counts shard share a write)."""
        now = await self._now()
        candidates = [rec.batch_id for rec in await self.batches(run_id) if rec.state == PUBLISHED or rec.expired(now)]
        taken: list[BatchRecord] = []
        while candidates and (limit is None or len(taken) < limit):
            size = CLAIM_WINDOW if limit is None else min(CLAIM_WINDOW, limit - len(taken))
            window, candidates = candidates[:size], candidates[size:]
            got = await asyncio.gather(*(self.claim(run_id, batch_id, owner=owner) for batch_id in window))
            taken.extend(rec for rec in got if rec is not None)
        return taken

    async def claim_run(self, run_id: str, *, owner: str | None = None) -> tuple[list[BatchRecord], bool]:
        """Claim every claimable batch of a run for a job that consumes the whole run: ``(claims, consumed)``,
        ``consumed`` True when the run was consumed before (an earlier attempt whose success was not heard) and
        nothing was claimed. Batches another attempt holds before its deadline: the claims taken are given back
        and :class:`LedgerConflictError` is raised, for the job must not read batches under nobody's claim.
        Both are decided on counts read from the stream leader, which has every change acknowledged before."""
        claims = await self.claim_available(run_id, owner=owner)
        summary = await self.summary(run_id, leader=True)
        held = summary["states"].get(IN_PROGRESS, 0) - len(claims)
        if held > 0:
            if claims:
                await self.settle(claims, error=f"{held} batch(es) of the run held by another attempt")
            raise LedgerConflictError(
                f"run {run_id!r}: {held} batch(es) are claimed by another attempt whose deadline has not passed; "
                "nothing was read or removed. Run again after that deadline (keep the claim deadline, "
                "visibility_timeout, below Airflow's heartbeat timeout + retry delay so a retry finds it passed)")
        consumed = not claims and bool(summary["batches"]) and summary["states"].get(CONSUMED, 0) == summary["batches"]
        return claims, consumed

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
        push = partial(extended, claim=claim, now=await self._now(), visibility_timeout=self.visibility_timeout)
        rec, _ = await store.apply(self, claim.run_id, claim.batch_id, push)
        return rec

    async def mark_consumed(self, claim: BatchRecord) -> BatchRecord:
        """``in_progress`` -> ``consumed`` for a claim this caller holds. Call it only after the
        output is written. Idempotent for the same claim; :class:`ClaimLostError` if the claim was
        reaped (the batch will be consumed again: keep outputs idempotent per batch)."""
        finish = partial(marked_consumed, claim=claim, now=self.clock())
        rec, changed = await store.apply(self, claim.run_id, claim.batch_id, finish)
        if changed:
            metrics.incr("ledger.consumed", tags={"stream": rec.stream})
        return rec

    async def release(self, claim: BatchRecord, *, error: str) -> BatchRecord:
        """Give up a held claim after a failed attempt: back to ``published`` for the next attempt,
        or ``failed`` when the batch had ``max_attempts`` attempts. ``error`` is kept as last_error."""
        give_up = partial(ended, claim=claim, now=self.clock(), error=error, max_attempts=self.max_attempts)
        rec, _ = await store.apply(self, claim.run_id, claim.batch_id, give_up)
        report_transition(rec)
        return rec

    async def reap(self, run_id: str | None = None) -> dict[str, Any]:
        """Return expired claims of ``run_id`` (all runs when None) to ``published``, or move them to
        ``failed`` past max attempts. Returns ``{"returned": [...], "failed": [...], "returned_count": n,
        "failed_count": m}``: the counts cover every reaped batch, the lists the first 100 records (as dicts).

        Reads the run's counts first: while no claim of the run can have expired yet, that is all it does.
        Each counts shard keeps ``next_deadline``, a time no claim of its subset expires before. Otherwise it
        lists the run once, reaps what expired in the shards due, and sets each such shard's ``next_deadline``
        to the earliest deadline still in progress there, unless a claim of that subset was made meanwhile (the
        shard's ``claims`` moved), which leaves the older, earlier bound: still a correct lower bound, so
        nothing is ever missed.
        """
        now = await self._now()
        result: dict[str, Any] = {"returned": [], "failed": [], "returned_count": 0, "failed_count": 0}
        counted = await store.read_counts(self.conn, self.bucket, run_id) if run_id is not None else {}
        if counted is None and await find_stream(self.conn, stream_of(self.bucket)) is None:
            return result  # no bucket: nothing
        shards = counted or {}
        due = due_shards(shards, now) if shards else None  # None: every shard (all runs, or a run without counts)
        if due == set():
            return result  # no claim of the run can have expired yet
        bounds: dict[int, str | None] = dict.fromkeys(due or (), None)
        async with aclosing(self.iter_batches(run_id, state=IN_PROGRESS)) as candidates:
            async for candidate in candidates:
                shard = shard_of(candidate.batch_id)
                if due is not None and shard not in due:
                    continue
                rec, changed = candidate, False
                if candidate.expired(now):
                    await self.prepare()
                    rec, changed = await store.apply(self, candidate.run_id, candidate.batch_id, partial(
                        ended, now=now, max_attempts=self.max_attempts))
                if changed:
                    report_transition(rec)
                    outcome = "failed" if rec.state == FAILED else "returned"
                    result[f"{outcome}_count"] += 1
                    if len(result[outcome]) < MAX_LISTED:
                        result[outcome].append(rec.to_dict())
                elif rec.state == IN_PROGRESS and shard in bounds:
                    bounds[shard] = earliest(bounds[shard], rec.deadline)
        if run_id is not None and bounds:
            await self.prepare()
            for shard, deadline in bounds.items():
                await self._settle_deadline(run_id, shard, shards[shard].get("claims", 0), deadline)
        return result

    async def requeue(self, run_id: str, *, batch_ids: Iterable[str] | None = None,
                      states: Iterable[str] = (FAILED,)) -> list[BatchRecord]:
        """Put batches back to ``published`` with a fresh attempt count: dead letters after the cause
        was fixed (default), or ``states=("consumed", "failed")`` to consume a run again (replay)."""
        wanted_states = set(states)
        unknown = wanted_states - set(STATES)
        if unknown:
            raise InvalidRequestError(f"unknown state(s) {sorted(unknown)}; use {', '.join(STATES)}")
        if batch_ids is None:
            summary = await self.summary(run_id, leader=True)
            if not any(summary["states"].get(state) for state in wanted_states):
                return []
            ids = [rec.batch_id for rec in await self.batches(run_id) if rec.state in wanted_states]
        else:
            ids = list(batch_ids)
        reopen = partial(reopened, now=self.clock(), states=wanted_states)
        requeued = []
        for batch_id in ids:
            rec, changed = await store.apply(self, run_id, batch_id, reopen)
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

    async def _now(self) -> float:
        """The time a claim's deadline is set or judged by: the server's clock unless the ledger was given one."""
        if isinstance(self.clock, ServerClock):
            with contextlib.suppress(StreamNotFoundError):  # no bucket holds no claim: the call reports it
                await self.clock.sync(self.conn, stream_of(self.bucket))
        return self.clock()

    async def read_entries(self, keys: list[str], *, leader: bool = False) -> dict[str, Entry]:
        """The last value of ledger keys (batch records, counts shards, filters of them), by key, in one request;
        ``leader``: from the stream leader, literal keys only (:func:`~.store.read_last`)."""
        try:
            return await store.read_last(self.conn, self.bucket, keys, leader=leader)
        except StreamNotFoundError:
            raise LedgerNotFoundError(
                f"ledger bucket {self.bucket!r} does not exist, or does not allow direct gets (a bucket an older "
                "version created): open it with BatchLedger.open(conn, bucket)") from None

    async def _settle_deadline(self, run_id: str, shard: int, claims_before: int, deadline: str | None) -> None:
        """Set the shard's ``next_deadline`` to ``deadline`` (the earliest one the reaper's listing saw in
        progress) unless a claim of the subset was made since the counts were read."""
        key = counts_key(run_id, shard)
        for _ in range(_SETTLE_ATTEMPTS):
            entry = (await store.read_last(self.conn, self.bucket, [key])).get(key)
            if entry is None or entry.deleted:
                return
            value = shards_of({key: entry})[shard]
            if value.get("claims", 0) != claims_before or value.get("next_deadline") == deadline:
                return
            value["next_deadline"] = deadline if value["states"].get(IN_PROGRESS) else None
            try:
                await store.write(self.conn, self.bucket, [Write(key, encode_counts(value), entry.seq)],
                                  context=f"ledger {self.bucket!r} run {run_id!r} counts shard {shard}")
            except CasConflict:
                continue
            return
