"""Group commit: the changes one process makes to one run of the batch ledger are written together.

Every record change writes its run's counts shard too (one atomic batch, each key compare-and-set), so
changes to the same shard must take turns, and each atomic batch has a cost of its own on the server (an R1
file stream stages it in a file store). Instead of racing each other, the changes a process makes to one
run queue in a lane; one task writes the lane's queue as atomic batches of up to :data:`GROUP` records plus
the new counts of each shard they touch: one read (every record of the group and those shards, one direct
get) and one commit for the group. Writers in other processes still race: a moved key fails the whole
batch, which is read again and decided again, change by change.

A batch that got no answer may or may not be stored: the next read shows, change by change, whether the
record holds exactly what was written.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from airflow_jetstream.client import metrics
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import BatchNotFoundError, ClaimLostError, LedgerConflictError, RequestTimeoutError
from airflow_jetstream.client.kv.keys import BUSY, CasConflict, Write
from airflow_jetstream.client.ledger import store
from airflow_jetstream.client.ledger.counts import counted, decode_counts, encode_counts
from airflow_jetstream.client.ledger.records import BatchRecord, Entry, batch_key, counts_key, shard_of

#: Records written in one atomic batch with their shard (the server allows 1,000 messages per batch).
GROUP = 256
#: Compare-and-set rounds a change may take before giving up (writers of other processes re-read and retry).
CAS_ATTEMPTS = 50

Change = Callable[[BatchRecord | None], BatchRecord | None]


class Ledger(Protocol):
    """What the group commit needs of a ledger: its bucket on a connection, the clock its counts are stamped
    by, and how it reads keys (:meth:`BatchLedger.read_entries`)."""

    @property
    def conn(self) -> JetStreamConnection: ...

    @property
    def bucket(self) -> str: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    async def read_entries(self, keys: list[str], *, leader: bool = False) -> dict[str, Entry]: ...


async def apply(ledger: Ledger, run_id: str, batch_id: str, change: Change, *,
                creates: bool = False) -> tuple[BatchRecord, bool]:
    """Apply ``change`` to the batch's current record (None: not recorded) and its run's counts, as one
    atomic compare-and-set write shared with this process's other changes of the same run.
    ``change`` returns the new record, or None to leave it; returns (record, changed)."""
    shard = shard_of(batch_id)
    item = Pending(run_id=run_id, batch_id=batch_id, key=batch_key(run_id, batch_id), shard=shard,
                   ckey=counts_key(run_id, shard), change=change, creates=creates)
    return await _submit(ledger, item)


@dataclass(eq=False)
class Pending:
    """One change waiting in a lane; ``done`` gets (record, changed) or the change's error."""

    run_id: str
    batch_id: str
    key: str
    #: the batch's counts shard and its key
    shard: int
    ckey: str
    change: Change
    creates: bool
    done: asyncio.Future[tuple[BatchRecord, bool]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    #: What each unanswered write put under ``key``: one found there on a later read was stored. All of them are
    #: kept: each was conditioned on the revision its read saw, so at most one can be stored, possibly an earlier
    #: one (a write that timed out can commit late, after the next try met no stream leader).
    unanswered: list[bytes] = field(default_factory=list)
    attempts: int = 0


@dataclass(eq=False)
class Lane:
    queue: list[Pending] = field(default_factory=list)
    worker: asyncio.Task[None] | None = None


_LANES: weakref.WeakKeyDictionary[JetStreamConnection, dict[tuple[str, str], Lane]] = weakref.WeakKeyDictionary()


async def _submit(ledger: Ledger, item: Pending) -> tuple[BatchRecord, bool]:
    """Queue ``item`` in the lane of its run and wait for its outcome."""
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
    finally:
        lane.worker = None
        for item in lane.queue:
            _settle(item, LedgerConflictError("the ledger writer of this run stopped; retry the change"))
        lane.queue.clear()
        if lanes.get(name) is lane:
            del lanes[name]


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
        unsure: list[Pending] = []  # refused or left alone on a replica's read: the leader decides
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
                    if conn.clustered and not leader:
                        unsure.append(item)
                        continue
                    _settle(item, (current, False) if current is not None else
                            LedgerConflictError(f"batch {item.batch_id!r}: nothing to write"))
                    continue
                payload = new.encode()
                counts[item.ckey] = counted(counts[item.ckey], item.run_id, item.shard, current, new, ledger.clock())
            except Exception as exc:  # this change's own error (e.g. ClaimLostError) is its caller's
                if conn.clustered and not leader and isinstance(exc, BatchNotFoundError | ClaimLostError):
                    unsure.append(item)  # a replica that has not applied the latest write yet
                    continue
                _settle(item, exc)
                continue
            writes.append(Write(item.key, payload, entry.seq if entry else 0))
            written.append((item, new))
        group = [item for item, _ in written]
        if not writes:
            group, leader = unsure, True
            continue
        touched = {item.ckey: counts[item.ckey] for item in group}  # each counted its change in its shard
        writes += [Write(ckey, encode_counts(value), found[ckey].seq if ckey in found else 0)
                   for ckey, value in sorted(touched.items()) if value is not None]
        try:
            last = await store.write(conn, bucket, writes, context=f"ledger {bucket!r} run {group[0].run_id!r}")
        except CasConflict:
            metrics.incr("ledger.cas_retry")
            leader = conn.clustered
            _count_attempt(group, bucket)
            pause = BUSY.pause(group[0].attempts) if group else 0.0
            group += unsure
            await asyncio.sleep(pause)
            continue
        except RequestTimeoutError:
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since > conn.settings.leader_wait:
                raise
            for (item, _), sent in zip(written, writes, strict=False):
                item.unanswered.append(sent.data)
            group += unsure
            continue
        first = last - len(writes) + 1
        for number, (item, new) in enumerate(written):
            _settle(item, (replace(new, revision=first + number), True))
        group, leader = unsure, True


async def _recounted(ledger: Ledger, group: list[Pending], found: Mapping[str, Entry]) -> bool:
    """Recount the run first when ``group``'s shards are missing and the run was recorded without counts; True
    when the recount rewrote counts (read again), False when the shards are simply new."""
    has_record = any(item.key in found and not found[item.key].deleted for item in group)
    if not await store.needs_recount(ledger.conn, ledger.bucket, group[0].run_id, has_record=has_record):
        return False
    recount = await store.recount_run(ledger.conn, ledger.bucket, group[0].run_id, repair=True, now=ledger.clock)
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
