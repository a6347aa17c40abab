"""Checking a run's counts against its records, and rewriting them from the records (a repair).

The provider's own writes keep counts and records together (one atomic batch each), so counts drift only
when something writes records without them: a service that does not follow the ledger contract, a record
deleted or edited by hand, or a run recorded by a version before the ledger kept counts. A recount lists the
run (O(n)), counts its records per shard and compares; a repair writes all 16 shards as one atomic batch,
each compare-and-set on what was read before the listing, so a change made meanwhile makes it start over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from airflow_jetstream.client import metrics
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import LedgerConflictError
from airflow_jetstream.client.ledger.counts import SHARDS, counts_key, counts_pattern, encode_counts, merged, recounted
from airflow_jetstream.client.ledger.listing import list_batches
from airflow_jetstream.client.ledger.status import run_recorded, shards_of
from airflow_jetstream.client.ledger.store import CasConflict, Write, read_last, write

log = logging.getLogger(__name__)
#: Repairs one recount tries before giving up while writers keep changing the run.
REPAIR_ATTEMPTS = 5
_COMPARED = ("batches", "states", "messages", "attempts", "streams")


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
