"""A run's state from its records: counts by state (:func:`summarize`) and whether it reached a state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_jetstream.client.errors import BatchesFailedError, InvalidRequestError
from airflow_jetstream.client.ledger.records import (
    FAILED,
    IN_PROGRESS,
    RANK,
    STATES,
    WAITABLE_STATES,
    BatchRecord,
    epoch_of,
)

#: Failed batches a summary lists, and records a reap returns per outcome (the counts cover all).
MAX_LISTED = 100


class RunTally:
    """A run's summary computed one record at a time (memory independent of the number of batches)."""

    def __init__(self, run_id: str, bucket: str, now: float) -> None:
        self.run_id, self.bucket, self.now = run_id, bucket, now
        self.batches = self.attempts = self.expired_claims = 0
        self.states = dict.fromkeys(STATES, 0)
        self.messages = dict.fromkeys(STATES, 0)
        self.streams: set[str] = set()
        self.failed: list[dict[str, Any]] = []
        self.next_deadline: str | None = None

    def add(self, rec: BatchRecord) -> None:
        self.batches += 1
        self.states[rec.state] = self.states.get(rec.state, 0) + 1
        self.messages[rec.state] = self.messages.get(rec.state, 0) + rec.count
        self.attempts += rec.attempts
        self.expired_claims += rec.expired(self.now)
        self.streams.add(rec.stream)
        if rec.state == IN_PROGRESS and rec.deadline and (
                self.next_deadline is None or epoch_of(rec.deadline) < epoch_of(self.next_deadline)):
            self.next_deadline = rec.deadline
        if rec.state == FAILED and len(self.failed) < MAX_LISTED:
            self.failed.append({"batch_id": rec.batch_id, "stream": rec.stream, "first_seq": rec.first_seq,
                                "last_seq": rec.last_seq, "count": rec.count, "attempts": rec.attempts,
                                "last_error": rec.last_error})

    def result(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "bucket": self.bucket,
            "batches": self.batches,
            "states": self.states,
            "messages": self.messages,
            "attempts": self.attempts,
            "expired_claims": self.expired_claims,
            "streams": sorted(self.streams),
            "failed": self.failed,
            "next_deadline": self.next_deadline,
        }


def summarize(run_id: str, bucket: str, records: Iterable[BatchRecord], now: float) -> dict[str, Any]:
    """Counts by state; ``failed`` lists the first 100 failed batches (``states`` counts all)."""
    tally = RunTally(run_id, bucket, now)
    for rec in records:
        tally.add(rec)
    return tally.result()


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
