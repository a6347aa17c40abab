"""Batch ledger: the state of every batch of a run in a KV bucket, changed only by compare-and-set.

JetStream carries the data; the ledger (KV bucket ``batch_ledger`` by default) carries one entry per
batch of a run: where the batch is (stream, sequence range, message count), its state, how many
consume attempts it took, timestamps and the last error. Every change is a revision-checked update,
so two processes can never both move the same batch.

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
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import Any

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.streams import replication_config
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    BatchesFailedError,
    BatchNotFoundError,
    InvalidRequestError,
    LeaderUnavailableError,
    LedgerConflictError,
    LedgerNotFoundError,
    LedgerWaitTimeoutError,
)
from airflow_jetstream.client.kv.replication import bucket_replicas, create_bucket, ensure_bucket_replication
from airflow_jetstream.client.ledger.kv_errors import kv_errors
from airflow_jetstream.client.ledger.records import (
    CONSUMED,
    DEFAULT_BUCKET,
    FAILED,
    IN_PROGRESS,
    KEY_SAFE,
    PUBLISHED,
    STATES,
    WAITABLE_STATES,
    BatchRecord,
    batch_key,
    check_id,
    iso_time,
    key_token,
)
from airflow_jetstream.client.ledger.summary import (
    MAX_LISTED,
    RunTally,
    check_waitable_state,
    count_reached,
    run_reached,
    summarize,
)
from airflow_jetstream.client.ledger.transitions import (
    check_location,
    claimed,
    expired,
    extended,
    marked_consumed,
    released,
    reopened,
    report_transition,
)
from airflow_jetstream.client.reading.range_read import read_latest_per_subject
from airflow_jetstream.client.subjects import validate_name

log = logging.getLogger(__name__)

_CAS_ATTEMPTS = 25


class BatchLedger:
    """The batch ledger of one KV bucket. Build it with :meth:`open`.

    :param visibility_timeout: how long a claim holds a batch (seconds, ``"10m"`` or a timedelta).
    :param max_attempts: consume attempts per batch before it goes to ``failed``.
    :param clock: seconds since the epoch (``time.time``); tests pass a controllable clock.
    """

    def __init__(self, conn: JetStreamConnection, kv: KeyValue, bucket: str, *,
                 visibility_timeout: float | str | timedelta = "10m", max_attempts: int = 3,
                 clock: Callable[[], float] = time.time) -> None:
        self.conn = conn
        self.kv = kv
        self.bucket = bucket
        seconds = to_seconds(visibility_timeout, field="visibility_timeout")
        if seconds <= 0:
            raise InvalidRequestError(f"visibility_timeout must be positive, got {visibility_timeout!r}")
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise InvalidRequestError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        self.visibility_timeout = float(seconds)
        self.max_attempts = max_attempts
        self.clock = clock

    @classmethod
    async def open(cls, conn: JetStreamConnection, bucket: str = DEFAULT_BUCKET, *, create: bool = True,
                   history: int = 1, ttl: float | str | timedelta | None = None, replicas: int | None = None,
                   placement: dict[str, Any] | None = None,
                   visibility_timeout: float | str | timedelta = "10m", max_attempts: int = 3,
                   clock: Callable[[], float] = time.time) -> BatchLedger:
        """Open the ledger bucket, creating it when missing (``create``); ``ttl`` expires old runs.

        ``replicas`` (1-5) and ``placement`` (``{"cluster": ..., "tags": [...]}``): when None a new
        bucket gets :func:`default_replicas` (3 on a cluster, else 1) and an existing
        one keeps its own; when given, an existing bucket is changed to them.
        """
        if not isinstance(bucket, str) or not bucket or set(bucket) - KEY_SAFE:
            raise InvalidRequestError(
                f"ledger bucket {bucket!r} is not a valid KV bucket name (letters, digits, '_' and '-' only)",
                reason="invalid_name",
            )
        replication = replication_config(replicas, placement)
        async with kv_errors(conn, bucket, f"ledger bucket {bucket!r}"):
            try:
                kv = await conn.js.key_value(bucket)
                await ensure_bucket_replication(conn, bucket, replication)
            except nats.js.errors.BucketNotFoundError:
                if not create:
                    raise
                ttl_seconds = None if ttl is None else to_seconds(ttl, field="ttl")
                kv = await create_bucket(conn, replication, bucket=bucket, history=history, ttl=ttl_seconds,
                                         description="airflow-jetstream batch ledger")
                log.info("Created batch ledger bucket %s with %d replica(s)", bucket,
                         bucket_replicas(conn, replication))
        return cls(conn, kv, bucket, visibility_timeout=visibility_timeout, max_attempts=max_attempts, clock=clock)

    # reading

    async def get(self, run_id: str, batch_id: str) -> BatchRecord | None:
        """The batch's current record, or None when it was never recorded."""
        key = batch_key(run_id, batch_id)
        context = f"ledger {self.bucket!r} batch {batch_id!r}"

        async def read() -> Any:
            async with kv_errors(self.conn, self.bucket, context):
                try:
                    return await self.kv.get(key)
                except nats.js.errors.KeyNotFoundError:
                    return None

        entry = await self.conn.retry_leader(context, read)
        if entry is None:
            return None
        return BatchRecord.decode(entry.value or b"", entry.revision or 0, key)

    async def _latest(self, run_id: str | None) -> AsyncGenerator[tuple[int, str, BatchRecord | None], None]:
        """``(seq, key, record)`` of every key of ``run_id`` (all runs when None), in stream order;
        record None for a deleted, purged or expired key. A key updated during the read comes again."""
        pattern = f"{key_token(check_id(run_id, 'run_id'))}.*" if run_id is not None else ">"
        prefix = f"$KV.{self.bucket}."
        async with kv_errors(self.conn, self.bucket, f"ledger {self.bucket!r} listing", fail_fast=False):
            async for chunk in read_latest_per_subject(self.conn, f"KV_{self.bucket}", [prefix + pattern]):
                for subject, seq, _, headers, data in chunk:
                    key = subject[len(prefix):]
                    if headers and (headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers):
                        yield seq, key, None
                    else:
                        yield seq, key, BatchRecord.decode(data, seq, key)

    async def batches(self, run_id: str | None = None, *, state: str | None = None) -> list[BatchRecord]:
        """Every batch of ``run_id`` (of all runs when None), optionally only those in ``state``, sorted.

        Holds every record; :meth:`iter_batches` streams them instead.
        """
        latest: dict[str, BatchRecord] = {}
        async for _, key, rec in self._latest(run_id):
            if rec is None:
                latest.pop(key, None)
            else:
                latest[key] = rec
        records = (r for r in latest.values() if state is None or r.state == state)
        return sorted(records, key=lambda r: (r.run_id, r.batch_id))

    async def iter_batches(self, run_id: str | None = None, *,
                           state: str | None = None) -> AsyncGenerator[BatchRecord, None]:
        """Stream the batches of ``run_id`` (all runs when None) in stream order, holding one read chunk.

        A batch updated while the listing runs can come twice, its newer state last.
        """
        async with aclosing(self._latest(run_id)) as latest:
            async for _, _, rec in latest:
                if rec is not None and (state is None or rec.state == state):
                    yield rec

    async def summary(self, run_id: str) -> dict[str, Any]:
        """Counts of a run's batches and messages by state, plus the failed (dead-letter) batches.

        Computed while streaming the listing. The listing is exact when nothing was written to the
        bucket since it started (every key comes once); when something was, the summary is computed
        again from :meth:`batches` (one record per key held), so it never counts a batch twice.
        """
        info = await self.conn.api_request(f"STREAM.INFO.KV_{self.bucket}", context=f"ledger {self.bucket!r}")
        last_seq = int(info["state"].get("last_seq") or 0)
        tally = RunTally(run_id, self.bucket, self.clock())
        async with aclosing(self._latest(run_id)) as latest:
            async for seq, _, rec in latest:
                if seq > last_seq:
                    break
                if rec is not None:
                    tally.add(rec)
            else:
                return tally.result()
        metrics.incr("ledger.summary_relisted")
        return summarize(run_id, self.bucket, await self.batches(run_id), self.clock())

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
        key = batch_key(run_id, batch_id)
        now = iso_time(self.clock())
        rec = BatchRecord(run_id=run_id, batch_id=batch_id, stream=stream, count=count, first_seq=first_seq,
                          last_seq=last_seq, created_at=now, updated_at=now, meta=dict(meta or {}))
        payload = rec.encode()
        context = f"record batch {batch_id!r} of run {run_id!r}"

        async def create() -> int:
            # retried through elections: a create whose answer was lost finds its own record below
            async with kv_errors(self.conn, self.bucket, context):
                try:
                    return int(await self.kv.create(key, payload))
                except nats.js.errors.KeyWrongLastSequenceError:
                    return 0
                except nats.js.errors.KeyNotFoundError:
                    # nats-py's create re-reads a key the stream refused as existing; a replica that has not
                    # caught up yet answers "not found": ask again (an existing record is found by a later try)
                    raise LeaderUnavailableError(f"{context}: the record exists but the replica that answered "
                                                 "the read has not caught up yet") from None

        revision = await self.conn.retry_leader(context, create)
        if revision:
            metrics.incr("ledger.recorded", tags={"stream": stream})
            return replace(rec, revision=revision)
        existing = await self.get(run_id, batch_id)
        if existing is None:
            raise LedgerConflictError(f"batch {batch_id!r} of run {run_id!r} was deleted while being recorded")
        wanted = (stream, count, first_seq, last_seq)
        stored = (existing.stream, existing.count, existing.first_seq, existing.last_seq)
        if wanted != stored:
            raise LedgerConflictError(
                f"batch {batch_id!r} of run {run_id!r} is already recorded as {stored} "
                f"(stream, count, first_seq, last_seq), not {wanted}; batch ids must be deterministic per "
                "run, so this is another batch reusing the id: use a distinct batch id",
            )
        return existing

    async def claim(self, run_id: str, batch_id: str, *, owner: str | None = None) -> BatchRecord | None:
        """Claim a batch for one consume attempt: ``published`` -> ``in_progress`` until the
        visibility deadline. Returns the claimed record (pass it to :meth:`mark_consumed`), or None
        when another attempt holds it, it is consumed or failed. Exactly one of racing claimers wins.
        An expired claim is treated as a dead attempt first (as :meth:`reap` would)."""
        take = partial(claimed, now=self.clock(), owner=owner, visibility_timeout=self.visibility_timeout,
                       max_attempts=self.max_attempts)
        rec, changed = await self._cas(run_id, batch_id, take)
        if changed and rec.state == IN_PROGRESS:
            metrics.incr("ledger.claimed", tags={"stream": rec.stream})
            return rec
        if changed:
            report_transition(rec)  # the expired attempt was the last one: the dead letter is stored
        return None

    async def claim_available(self, run_id: str, *, owner: str | None = None,
                              limit: int | None = None) -> list[BatchRecord]:
        """Claim up to ``limit`` claimable batches of a run (published, or with an expired claim)."""
        now = self.clock()
        claimed: list[BatchRecord] = []
        for rec in await self.batches(run_id):
            if limit is not None and len(claimed) >= limit:
                break
            if rec.state == PUBLISHED or rec.expired(now):
                got = await self.claim(run_id, rec.batch_id, owner=owner)
                if got is not None:
                    claimed.append(got)
        return claimed

    async def extend(self, claim: BatchRecord) -> BatchRecord:
        """Push the visibility deadline of a held claim forward (long processing)."""
        push = partial(extended, claim=claim, now=self.clock(), visibility_timeout=self.visibility_timeout)
        rec, _ = await self._cas(claim.run_id, claim.batch_id, push)
        return rec

    async def mark_consumed(self, claim: BatchRecord) -> BatchRecord:
        """``in_progress`` -> ``consumed`` for a claim this caller holds. Call it only after the
        output is written. Idempotent for the same claim; :class:`ClaimLostError` if the claim was
        reaped (the batch will be consumed again: keep outputs idempotent per batch)."""
        finish = partial(marked_consumed, claim=claim, now=self.clock())
        rec, changed = await self._cas(claim.run_id, claim.batch_id, finish)
        if changed:
            metrics.incr("ledger.consumed", tags={"stream": rec.stream})
        return rec

    async def release(self, claim: BatchRecord, *, error: str) -> BatchRecord:
        """Give up a held claim after a failed attempt: back to ``published`` for the next attempt,
        or ``failed`` when the batch had ``max_attempts`` attempts. ``error`` is kept as last_error."""
        give_up = partial(released, claim=claim, now=self.clock(), error=error, max_attempts=self.max_attempts)
        rec, _ = await self._cas(claim.run_id, claim.batch_id, give_up)
        report_transition(rec)
        return rec

    async def reap(self, run_id: str | None = None) -> dict[str, Any]:
        """Return expired claims of ``run_id`` (all runs when None) to ``published``, or move them to
        ``failed`` past max attempts, streaming the listing. Returns ``{"returned": [...], "failed":
        [...], "returned_count": n, "failed_count": m}``: the counts cover every reaped batch, the lists
        the first 100 records (as dicts) of each."""
        now = self.clock()
        reaped: dict[str, list[dict[str, Any]]] = {"returned": [], "failed": []}
        counts = {"returned": 0, "failed": 0}
        async with aclosing(self.iter_batches(run_id, state=IN_PROGRESS)) as candidates:
            async for candidate in candidates:
                if not candidate.expired(now):
                    continue

                def expire(rec: BatchRecord) -> BatchRecord | None:
                    return expired(rec, now, max_attempts=self.max_attempts) if rec.expired(now) else None

                rec, changed = await self._cas(candidate.run_id, candidate.batch_id, expire)
                if changed:
                    report_transition(rec)
                    outcome = "failed" if rec.state == FAILED else "returned"
                    counts[outcome] += 1
                    if len(reaped[outcome]) < MAX_LISTED:
                        reaped[outcome].append(rec.to_dict())
        return {**reaped, "returned_count": counts["returned"], "failed_count": counts["failed"]}

    async def requeue(self, run_id: str, *, batch_ids: Iterable[str] | None = None,
                      states: Iterable[str] = (FAILED,)) -> list[BatchRecord]:
        """Put batches back to ``published`` with a fresh attempt count: dead letters after the cause
        was fixed (default), or ``states=("consumed", "failed")`` to consume a run again (replay)."""
        wanted_states = set(states)
        unknown = wanted_states - set(STATES)
        if unknown:
            raise InvalidRequestError(f"unknown state(s) {sorted(unknown)}; use {', '.join(STATES)}")
        if batch_ids is None:
            ids = [rec.batch_id for rec in await self.batches(run_id) if rec.state in wanted_states]
        else:
            ids = list(batch_ids)
        reopen = partial(reopened, now=self.clock(), states=wanted_states)
        requeued = []
        for batch_id in ids:
            rec, changed = await self._cas(run_id, batch_id, reopen)
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

    async def _cas(self, run_id: str, batch_id: str,
                   change: Callable[[BatchRecord], BatchRecord | None]) -> tuple[BatchRecord, bool]:
        """Apply ``change`` to the current record with a revision-checked update, re-reading on a race.

        ``change`` returns the new record, or None to leave it; returns (record, changed).
        """
        key = batch_key(run_id, batch_id)
        context = f"ledger {self.bucket!r} batch {batch_id!r} of run {run_id!r}"
        for _ in range(_CAS_ATTEMPTS):
            current = await self.get(run_id, batch_id)
            if current is None:
                raise BatchNotFoundError(f"{context}: not recorded; record() it after publishing")
            new = change(current)
            if new is None:
                return current, False
            async with kv_errors(self.conn, self.bucket, context):
                try:
                    revision = await self.kv.update(key, new.encode(), last=current.revision)
                except nats.js.errors.KeyWrongLastSequenceError:
                    metrics.incr("ledger.cas_retry")
                    continue
            return replace(new, revision=revision), True
        raise LedgerConflictError(f"{context}: changed concurrently {_CAS_ATTEMPTS} times in a row; retry later")


async def ledger_status(conn: JetStreamConnection, run_id: str, state: str = CONSUMED, *,
                        bucket: str = DEFAULT_BUCKET, min_batches: int = 1, reap: bool = False,
                        fail_on_failed: bool = True) -> dict[str, Any]:
    """One look at a run for sensors and triggers: :meth:`BatchLedger.summary` plus ``done``,
    ``awaited``, ``reaped`` and, when batches failed (and ``fail_on_failed``), ``error``.

    A missing bucket counts as a run without batches (the producer has not recorded any yet).
    """
    check_waitable_state(state)
    reaped: dict[str, Any] = {"returned": [], "failed": [], "returned_count": 0, "failed_count": 0}
    try:
        ledger = await BatchLedger.open(conn, bucket, create=False)
    except LedgerNotFoundError:
        summary = summarize(run_id, bucket, [], time.time())
    else:
        if reap:
            result = await ledger.reap(run_id)
            reaped = {**result, "returned": [item["batch_id"] for item in result["returned"]],
                      "failed": [item["batch_id"] for item in result["failed"]]}
        summary = await ledger.summary(run_id)
    summary.update(awaited=state, reached=count_reached(summary, state), min_batches=min_batches, reaped=reaped)
    try:
        summary["done"] = run_reached(summary, state, min_batches=min_batches, fail_on_failed=fail_on_failed)
    except BatchesFailedError as exc:
        summary["done"] = False
        summary["error"] = exc.to_dict()
    return summary


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
    "ledger_status",
    "run_reached",
]
