"""A batch's state transitions, as functions from the current record to the new one (None: leave it).

Pure: they read no clock and write nothing; :class:`~airflow_jetstream.client.ledger.batch_ledger.BatchLedger`
applies each with a revision-checked update, re-reading on a race.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from airflow_jetstream.client import metrics
from airflow_jetstream.client.errors import ClaimLostError, InvalidRequestError
from airflow_jetstream.client.ledger.records import CONSUMED, FAILED, IN_PROGRESS, PUBLISHED, BatchRecord, iso_time

log = logging.getLogger(__name__)

#: characters of a release's error kept as ``last_error``
MAX_ERROR_LENGTH = 2000


def check_location(count: int, first_seq: int | None, last_seq: int | None) -> None:
    """Raise :class:`InvalidRequestError` unless ``count`` messages fit in ``first_seq..last_seq``."""
    def is_int(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not is_int(count) or count < 0:
        raise InvalidRequestError(f"count must be an integer >= 0, got {count!r}")
    for name, value in (("first_seq", first_seq), ("last_seq", last_seq)):
        if value is not None and (not is_int(value) or value < 1):
            raise InvalidRequestError(f"{name} must be a stream sequence >= 1 or None, got {value!r}")
    if first_seq is not None and last_seq is not None:
        if first_seq > last_seq:
            raise InvalidRequestError(f"first_seq {first_seq} is after last_seq {last_seq}")
        if count > last_seq - first_seq + 1:
            raise InvalidRequestError(f"count {count} does not fit in the sequence range {first_seq}..{last_seq}")


def claimed(rec: BatchRecord, now: float, *, owner: str | None, visibility_timeout: float,
            max_attempts: int) -> BatchRecord | None:
    """``published`` -> ``in_progress`` until ``now + visibility_timeout``; None when not claimable.
    An expired claim ends first (the dead letter, when that was the last attempt)."""
    if rec.expired(now):
        rec = expired(rec, now, max_attempts=max_attempts)
        if rec.state == FAILED:
            return rec
    if rec.state != PUBLISHED:
        return None
    return replace(
        rec, state=IN_PROGRESS, attempts=rec.attempts + 1, max_attempts=max_attempts, owner=owner,
        claim_id=uuid.uuid4().hex,
        claimed_at=iso_time(now), deadline=iso_time(now + visibility_timeout), updated_at=iso_time(now),
    )


def extended(rec: BatchRecord, claim: BatchRecord, now: float, *, visibility_timeout: float) -> BatchRecord:
    """The held ``claim`` with its deadline pushed to ``now + visibility_timeout``."""
    require_claim(rec, claim, "extend")
    return replace(rec, deadline=iso_time(now + visibility_timeout), updated_at=iso_time(now))


def marked_consumed(rec: BatchRecord, claim: BatchRecord, now: float) -> BatchRecord | None:
    """``in_progress`` -> ``consumed`` for the held ``claim``; None when this claim already did it."""
    if rec.state == CONSUMED and rec.claim_id == claim.claim_id:
        return None
    require_claim(rec, claim, "mark consumed")
    return replace(rec, state=CONSUMED, consumed_at=iso_time(now), updated_at=iso_time(now), deadline=None)


def released(rec: BatchRecord, claim: BatchRecord, now: float, *, error: str, max_attempts: int) -> BatchRecord:
    """The held ``claim`` given up after a failed attempt (``error`` kept as ``last_error``)."""
    require_claim(rec, claim, "release")
    return expired(rec, now, max_attempts=max_attempts, error=str(error)[:MAX_ERROR_LENGTH])


def expired(rec: BatchRecord, now: float, *, max_attempts: int, error: str | None = None) -> BatchRecord:
    """The record after a dead or failed attempt: published again, or failed past max attempts.

    The limit is the one the claimer set (stored with the claim), so any reaper applies it;
    ``max_attempts`` is the fallback for a record without one.
    """
    reason = error or (
        f"attempt {rec.attempts} by {rec.owner or 'an unnamed consumer'} did not finish before its "
        f"visibility deadline {rec.deadline}"
    )
    cleared: dict[str, Any] = {"owner": None, "claim_id": None, "claimed_at": None, "deadline": None,
               "updated_at": iso_time(now), "last_error": reason}
    if rec.attempts >= (rec.max_attempts or max_attempts):
        return replace(rec, state=FAILED, failed_at=iso_time(now), **cleared)
    return replace(rec, state=PUBLISHED, **cleared)


def reopened(rec: BatchRecord, now: float, *, states: Collection[str]) -> BatchRecord | None:
    """Back to ``published`` with a fresh attempt count when the record is in one of ``states``."""
    if rec.state not in states:
        return None
    return replace(rec, state=PUBLISHED, attempts=0, owner=None, claim_id=None, claimed_at=None,
                   deadline=None, consumed_at=None, failed_at=None, updated_at=iso_time(now))


def require_claim(rec: BatchRecord, claim: BatchRecord, action: str) -> None:
    """Raise :class:`ClaimLostError` unless ``rec`` is still held by ``claim``."""
    if claim.claim_id is None or rec.state != IN_PROGRESS or rec.claim_id != claim.claim_id:
        raise ClaimLostError(
            f"cannot {action} batch {rec.batch_id!r} of run {rec.run_id!r}: this claim is no longer held "
            f"(batch is {rec.state}, attempt {rec.attempts}); its visibility timeout expired and it was "
            "returned for another attempt: raise visibility_timeout or call extend() while working",
        )


def report_transition(rec: BatchRecord) -> None:
    """Count and log a batch that went back to ``published`` or on to ``failed`` (the dead letter)."""
    if rec.state == FAILED:
        metrics.incr("ledger.dead_lettered", tags={"stream": rec.stream})
        log.warning("Batch %s of run %s failed after %d attempt(s): %s", rec.batch_id, rec.run_id,
                    rec.attempts, rec.last_error)
    elif rec.state == PUBLISHED:
        metrics.incr("ledger.returned", tags={"stream": rec.stream})
        log.info("Batch %s of run %s returned for another attempt (%d so far): %s", rec.batch_id,
                 rec.run_id, rec.attempts, rec.last_error)
