"""The reaper: claims whose visibility deadline passed go back to ``published``, or to ``failed`` past max attempts.

Each counts shard keeps ``next_deadline``, a time no claim of its subset expires before. While that is ahead
for every shard with claims in progress, a reap reads the counts (one request) and stops. Otherwise it lists
the run once, reaps what expired in those shards, and sets each shard's ``next_deadline`` to the earliest
deadline still in progress there, unless a claim of that subset was made meanwhile (the shard's ``claims``
moved), which leaves the older, earlier bound: still a correct lower bound, so nothing is ever missed.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.admin.streams import find_stream
from airflow_jetstream.client.ledger.counts import counts_key, encode_counts, shard_of
from airflow_jetstream.client.ledger.records import FAILED, IN_PROGRESS, BatchRecord, epoch_of
from airflow_jetstream.client.ledger.status import read_counts, shards_of
from airflow_jetstream.client.ledger.store import CasConflict, Write, read_last, stream_of, write
from airflow_jetstream.client.ledger.summary import MAX_LISTED
from airflow_jetstream.client.ledger.transitions import expired, report_transition

if TYPE_CHECKING:
    from airflow_jetstream.client.ledger.batch_ledger import BatchLedger

_SETTLE_ATTEMPTS = 5


def due_shards(shards: dict[int, dict[str, Any]], now: float) -> set[int]:
    """Shards with claims in progress of which one may have expired by ``now``."""
    return {n for n, value in shards.items() if value["states"].get(IN_PROGRESS) and
            (not value.get("next_deadline") or epoch_of(value["next_deadline"]) <= now)}


async def reap(ledger: BatchLedger, run_id: str | None) -> dict[str, Any]:
    """See :meth:`BatchLedger.reap`."""
    now = ledger.clock()
    due: set[int] | None = None  # None: every shard (all runs, or a run without counts)
    shards: dict[int, dict[str, Any]] = {}
    if run_id is not None:
        counted = await read_counts(ledger.conn, ledger.bucket, run_id)
        if counted is None and await find_stream(ledger.conn, stream_of(ledger.bucket)) is None:
            return _result({"returned": [], "failed": []}, {"returned": 0, "failed": 0})  # no bucket: nothing
        shards = counted or {}
        if shards:
            due = due_shards(shards, now)
            if not due:
                return _result({"returned": [], "failed": []}, {"returned": 0, "failed": 0})
    reaped: dict[str, list[dict[str, Any]]] = {"returned": [], "failed": []}
    counts = {"returned": 0, "failed": 0}
    earliest: dict[int, str | None] = dict.fromkeys(due or (), None)
    async with aclosing(ledger.iter_batches(run_id, state=IN_PROGRESS)) as candidates:
        async for candidate in candidates:
            shard = shard_of(candidate.batch_id)
            if due is not None and shard not in due:
                continue
            rec, changed = candidate, False
            if candidate.expired(now):
                await ledger.prepare()
                rec, changed = await ledger._apply(candidate.run_id, candidate.batch_id, _expire(now, ledger))
            if changed:
                report_transition(rec)
                outcome = "failed" if rec.state == FAILED else "returned"
                counts[outcome] += 1
                if len(reaped[outcome]) < MAX_LISTED:
                    reaped[outcome].append(rec.to_dict())
            elif rec.state == IN_PROGRESS and shard in earliest and rec.deadline:
                known = earliest[shard]
                earliest[shard] = rec.deadline if known is None or epoch_of(rec.deadline) < epoch_of(known) else known
    if run_id is not None and earliest:
        await ledger.prepare()
        for shard, deadline in earliest.items():
            await _settle(ledger, run_id, shard, shards[shard].get("claims", 0), deadline)
    return _result(reaped, counts)


def _expire(now: float, ledger: BatchLedger) -> Any:
    def change(rec: BatchRecord | None) -> BatchRecord | None:
        if rec is None or not rec.expired(now):
            return None
        return expired(rec, now, max_attempts=ledger.max_attempts)
    return change


async def _settle(ledger: BatchLedger, run_id: str, shard: int, claims_before: int, deadline: str | None) -> None:
    """Set the shard's ``next_deadline`` to ``deadline`` (the earliest one the listing saw in progress) unless a
    claim of the subset was made since the counts were read."""
    key = counts_key(run_id, shard)
    for _ in range(_SETTLE_ATTEMPTS):
        entry = (await read_last(ledger.conn, ledger.bucket, [key])).get(key)
        if entry is None or entry.deleted:
            return
        value = shards_of({key: entry})[shard]
        if value.get("claims", 0) != claims_before or value.get("next_deadline") == deadline:
            return
        value["next_deadline"] = deadline if value["states"].get(IN_PROGRESS) else None
        try:
            await write(ledger.conn, ledger.bucket, [Write(key, encode_counts(value), entry.seq)],
                        context=f"ledger {ledger.bucket!r} run {run_id!r} counts shard {shard}")
        except CasConflict:
            continue
        return


def _result(reaped: dict[str, list[dict[str, Any]]], counts: dict[str, int]) -> dict[str, Any]:
    return {**reaped, "returned_count": counts["returned"], "failed_count": counts["failed"]}
