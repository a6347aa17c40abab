"""A run's counts: how many of its batches (and messages) are in each state, kept beside the records, and the
run's one summary merged from them. Pure: no I/O. The value schema is docs/schemas/ledger-counts.schema.json.

A run's batches are split into :data:`~.records.SHARDS` subsets by ``crc32(batch_id) % 16``; each subset's counts
are one KV value under ``<run>./counts.<n>`` (3 key tokens, so ``<run>.*`` still lists only the batches), written
in the same atomic batch as each record change, both compare-and-set, so a subset's counts always describe exactly
its records. Reading a run's counts is one direct get of at most 16 small values, whatever the run's size. Each
value is a snapshot (not a delta): a subset whose counts key expired (bucket ``ttl``) had every record expire first.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_jetstream.client.errors import BatchesFailedError, InvalidRequestError
from airflow_jetstream.client.ledger.records import (
    FAILED,
    IN_PROGRESS,
    RANK,
    SHARDS,
    STATES,
    WAITABLE_STATES,
    BatchRecord,
    Entry,
    dumped,
    epoch_of,
    iso_time,
    loaded,
    shard_of,
)

#: Failed batches each shard lists with details (the counts cover every failed batch).
FAILED_LISTED_PER_SHARD = 10
#: Characters of a failed batch's last error kept in the counts (the record keeps the whole text).
FAILED_ERROR_CHARS = 200
#: Failed batches a summary lists, and records a reap returns per outcome (the counts cover all).
MAX_LISTED = 100

_COUNTS = {"type": "object"}
_NATURAL = {"type": "integer", "minimum": 0}
#: JSON Schema (2020-12) of one counts value.
LEDGER_COUNTS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://airflow-jetstream.dev/schemas/ledger-counts.schema.json",
    "title": "airflow-jetstream batch ledger counts (one shard of a run)",
    "description": "The JSON value under <run>./counts.<n>: the counts of the run's batches whose "
                   "crc32(batch_id) % 16 is n. Written in the same atomic batch as every record change.",
    "type": "object",
    "required": ["run_id", "shard", "batches", "states", "messages"],
    "properties": {
        "run_id": {"type": "string", "minLength": 1},
        "shard": {"type": "integer", "minimum": 0},
        "batches": _NATURAL,
        "states": _COUNTS,
        "messages": _COUNTS,
        "attempts": _NATURAL,
        "claims": _NATURAL,
        "streams": {"type": "array"},
        "failed": {"type": "array"},
        "next_deadline": {"type": ["string", "null"], "format": "date-time"},
        "updated_at": {"type": "string", "format": "date-time"},
    },
    "additionalProperties": True,
}


def empty_counts(run_id: str, shard: int) -> dict[str, Any]:
    """The counts of a subset without batches."""
    return {"run_id": run_id, "shard": shard, "batches": 0, "states": dict.fromkeys(STATES, 0),
            "messages": dict.fromkeys(STATES, 0), "attempts": 0, "claims": 0, "streams": [], "failed": [],
            "next_deadline": None, "updated_at": ""}


def failed_entry(rec: BatchRecord) -> dict[str, Any]:
    """What the counts (and a summary) list of a failed batch."""
    error = rec.last_error[:FAILED_ERROR_CHARS] if rec.last_error else rec.last_error
    return {"batch_id": rec.batch_id, "stream": rec.stream, "first_seq": rec.first_seq, "last_seq": rec.last_seq,
            "count": rec.count, "attempts": rec.attempts, "last_error": error}


def earliest(*times: str | None) -> str | None:
    """The earliest of the times given (None: none given)."""
    known = [t for t in times if t]
    return min(known, key=epoch_of) if known else None


def counted(counts: Mapping[str, Any] | None, run_id: str, shard: int, old: BatchRecord | None,
            new: BatchRecord, now: float) -> dict[str, Any]:
    """The subset's counts after its batch went from ``old`` (None: just recorded) to ``new``."""
    value = json.loads(json.dumps(counts)) if counts else empty_counts(run_id, shard)
    count_record(value, new, old)
    value["updated_at"] = iso_time(now)
    return value


def count_record(value: dict[str, Any], new: BatchRecord, old: BatchRecord | None = None) -> None:
    """Count, in place, the subset's batch going from ``old`` to ``new``; ``old`` None adds a batch (a change
    that recorded it, a recount, the summary of a listed run).

    ``next_deadline`` stays a lower bound of the deadlines of the subset's claims in progress: a claim or
    an extension lowers it to its deadline when earlier; a finished claim leaves it (still a lower bound);
    it is None once nothing is in progress. The reaper sets it exactly after it listed the run.
    """
    states, messages = value["states"], value["messages"]
    if old is None:
        value["batches"] += 1
    else:
        states[old.state] = states.get(old.state, 0) - 1
        messages[old.state] = messages.get(old.state, 0) - old.count
    states[new.state] = states.get(new.state, 0) + 1
    messages[new.state] = messages.get(new.state, 0) + new.count
    value["attempts"] = value.get("attempts", 0) + new.attempts - (old.attempts if old else 0)
    if new.state == IN_PROGRESS and (old is None or old.claim_id != new.claim_id):
        value["claims"] = value.get("claims", 0) + 1
    if new.stream not in value.setdefault("streams", []):
        value["streams"] = sorted([*value["streams"], new.stream])
    if new.state == IN_PROGRESS:
        value["next_deadline"] = earliest(value.get("next_deadline"), new.deadline)
    if not states.get(IN_PROGRESS):
        value["next_deadline"] = None
    listed = [item for item in value.get("failed") or [] if item.get("batch_id") != new.batch_id]
    if new.state == FAILED and len(listed) < FAILED_LISTED_PER_SHARD:
        listed.append(failed_entry(new))
    value["failed"] = listed


def recounted(run_id: str, records: Iterable[BatchRecord], previous: Mapping[int, Mapping[str, Any]],
              now: float) -> dict[int, dict[str, Any]]:
    """Exact counts of every shard from the run's records (a recount); ``claims`` moves on from ``previous``
    so a reaper that read the counts before the recount sees them changed."""
    shards = {n: empty_counts(run_id, n) for n in range(SHARDS)}
    for rec in records:
        count_record(shards[shard_of(rec.batch_id)], rec)
    for n, value in shards.items():
        value["claims"] = int((previous.get(n) or {}).get("claims", 0)) + 1
        value["updated_at"] = iso_time(now)
    return shards


def compared(run_id: str, bucket: str, stored: Mapping[int, dict[str, Any]], records: Iterable[BatchRecord],
             now: float) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """A recount's result (``{"run_id", "bucket", "counted", "recounted", "drift", "shards", "repaired": False}``:
    the summaries of the stored counts and of the records, the totals that differ, the shards that differ) and the
    recounted shards."""
    fresh = recounted(run_id, records, stored, now)
    counted_summary = merged(run_id, bucket, stored, now)
    recounted_summary = merged(run_id, bucket, {n: v for n, v in fresh.items() if v["batches"]}, now)
    drift = {name: {"counted": counted_summary[name], "recounted": recounted_summary[name]}
             for name in ("batches", "states", "messages", "attempts", "streams")
             if counted_summary[name] != recounted_summary[name]}
    wrong = [n for n in range(SHARDS) if _core(stored.get(n)) != _core(fresh[n])]
    return {"run_id": run_id, "bucket": bucket, "counted": counted_summary, "recounted": recounted_summary,
            "drift": drift, "shards": wrong, "repaired": False}, fresh


def _core(value: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What a recount compares of a shard (a missing shard is one without batches)."""
    if not value or not value.get("batches"):
        return (0,)
    nonzero = [sorted((state, n) for state, n in value[name].items() if n) for name in ("states", "messages")]
    return (value["batches"], *nonzero, value.get("attempts", 0), sorted(value.get("streams") or []))


def merged(run_id: str, bucket: str, shards: Mapping[int, Mapping[str, Any]], now: float) -> dict[str, Any]:
    """A run's summary from its counts shards.

    ``expired_claims`` is 0 when no claim can have expired yet (no shard is :func:`due <due_shards>`), else None:
    which claims expired is known only after a listing (the reaper's).
    """
    values = list(shards.values())
    deadlines = [value["next_deadline"] for value in values if value["states"].get(IN_PROGRESS)]
    return {"run_id": run_id, "bucket": bucket, "batches": sum(int(value["batches"]) for value in values),
            "states": {state: sum(int(value["states"].get(state, 0)) for value in values) for state in STATES},
            "messages": {state: sum(int(value["messages"].get(state, 0)) for value in values) for state in STATES},
            "attempts": sum(int(value.get("attempts", 0)) for value in values),
            "expired_claims": None if due_shards(shards, now) else 0,
            "streams": sorted({stream for value in values for stream in value.get("streams") or []}),
            "failed": sorted((item for value in values for item in value.get("failed") or []),
                             key=lambda item: item["batch_id"])[:MAX_LISTED],
            "next_deadline": earliest(*deadlines), "counted_by": "counts"}


def summarized(run_id: str, bucket: str, records: Iterable[BatchRecord], now: float) -> dict[str, Any]:
    """A run's summary from its records (one per batch, as a listing holds them): the counts' summary
    (:func:`merged` of a :func:`recounted`) with ``expired_claims`` exact, since every claim was seen."""
    held = list(records)
    return {**merged(run_id, bucket, recounted(run_id, held, {}, now), now),
            "expired_claims": sum(rec.expired(now) for rec in held), "counted_by": "listing"}


def decode_counts(data: bytes, key: str, seq: int) -> dict[str, Any]:
    """A stored counts value, checked against the counts schema."""
    return loaded(LEDGER_COUNTS_SCHEMA, data, key=key, seq=seq)


def encode_counts(value: Mapping[str, Any]) -> bytes:
    """The stored JSON of a counts value (checked against the schema)."""
    return dumped(LEDGER_COUNTS_SCHEMA, dict(value), key=f"{value.get('run_id')}./counts.{value.get('shard')}")


def due_shards(shards: Mapping[int, Mapping[str, Any]], now: float) -> set[int]:
    """Shards with claims in progress of which one may have expired by ``now``."""
    return {n for n, value in shards.items() if value["states"].get(IN_PROGRESS) and
            (not value.get("next_deadline") or epoch_of(value["next_deadline"]) <= now)}


def check_waitable_state(state: str) -> str:
    """Validate a state to wait for (``published``, ``in_progress`` or ``consumed``)."""
    if state not in WAITABLE_STATES:
        raise InvalidRequestError(
            f"cannot wait for state {state!r}; use one of {', '.join(WAITABLE_STATES)} "
            "(failed batches are reported by the wait itself)",
            reason="invalid_state",
        )
    return state


def count_reached(summary: dict[str, Any], state: str) -> int:
    """How many batches of a summary reached ``state`` (are there or further along; never failed ones)."""
    check_waitable_state(state)
    return sum(n for name, n in summary["states"].items() if name in RANK and RANK[name] >= RANK[state])


def run_reached(summary: dict[str, Any], state: str, *, min_batches: int = 1, fail_on_failed: bool = True) -> bool:
    """True when at least ``min_batches`` batches exist and all of them reached ``state``.

    A batch reached ``published`` when it is published, in progress or consumed; ``consumed`` only
    when consumed. Failed batches never reach a state: with ``fail_on_failed`` they raise
    :class:`BatchesFailedError` listing them (a dead letter must be looked at, not waited for).
    """
    check_waitable_state(state)
    failed = summary["states"].get(FAILED) or len(summary["failed"])
    if failed and fail_on_failed:
        listed = summary["failed"][:10]
        ids = ", ".join(item["batch_id"] for item in listed) + (", ..." if failed > len(listed) else "")
        raise BatchesFailedError(
            f"run {summary['run_id']!r}: {failed} batch(es) failed after their max attempts "
            f"({ids or 'BatchLedger.batches(run_id, state=failed) lists them'}); see each batch's last_error, "
            "fix the cause, then requeue them (BatchLedger.requeue) or clear the run",
            failed=summary["failed"],
        )
    if summary["batches"] < min_batches:
        return False
    return bool(count_reached(summary, state) == summary["batches"])


def shards_of(entries: Mapping[str, Entry]) -> dict[int, dict[str, Any]]:
    """Decoded counts shards by number, from the last values of a run's counts keys."""
    return {int(key.rsplit(".", 1)[1]): decode_counts(entry.data, key, entry.seq)
            for key, entry in entries.items() if not entry.deleted}
