"""One durable pull consumer per worker, filtered to the worker's subjects (consumer scaling, seed 004).

Each worker (a Spark reader partition, a worker process) owns one durable pull consumer ``<prefix>-<worker_id>``
whose ``filter_subjects`` are its subjects, updated in place when the assignment changes: diff-based (an
unchanged set sends nothing but the info request), capped (``max_subjects``), overlap-checked before anything is
sent, transient failures retried, and a failed update leaves the last good config serving. A
:class:`WorkerConsumerManager` also suppresses repeated assignments locally. docs/worker-consumers.md has it all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import nats.errors

from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.consumers import consumer_filters, consumer_info, delete_consumer, ensure_consumer
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    ConnectionFailedError,
    ConsumerConfigError,
    InvalidRequestError,
    InvalidSubjectError,
    JetStreamError,
    RequestTimeoutError,
    TooManySubjectsError,
)
from airflow_jetstream.client.retry import Backoff, retry
from airflow_jetstream.client.subjects import subjects_overlap, validate_name, validate_subjects

log = logging.getLogger(__name__)

DEFAULT_MAX_SUBJECTS = 500
#: Settings a worker consumer gets unless ``config`` overrides them.
DEFAULT_WORKER_CONFIG: dict[str, Any] = {"ack_policy": "explicit", "ack_wait": "30s", "max_ack_pending": 1000}
_OWNED_FIELDS = ("name", "durable_name", "filter_subject", "filter_subjects", "deliver_subject", "inactive_threshold")
_TRANSIENT_NATS_ERRORS = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
)


def worker_consumer_name(prefix: str, worker_id: str | int) -> str:
    """The durable name of a worker's consumer: ``<prefix>-<worker_id>``."""
    worker = str(worker_id)
    if not worker:
        raise InvalidRequestError("worker_id must not be empty", reason="invalid_name")
    return validate_name(f"{prefix}-{worker}", what="worker consumer name")


def normalize_subjects(subjects: Iterable[str], *, max_subjects: int = DEFAULT_MAX_SUBJECTS,
                       consumer: str = "worker consumer") -> list[str]:
    """Validated, de-duplicated, sorted filter subjects; raises before anything is sent.

    Empty lists, more than ``max_subjects`` subjects and overlapping filters (``orders.*`` with
    ``orders.eu``, which the server refuses) raise typed errors naming the problem.
    """
    if not isinstance(max_subjects, int) or isinstance(max_subjects, bool) or max_subjects < 1:
        raise InvalidRequestError(f"max_subjects must be an integer >= 1, got {max_subjects!r}")
    unique = sorted(set(validate_subjects(subjects, what=f"{consumer}: filter subjects")))
    if not unique:
        raise InvalidRequestError(
            f"{consumer}: no subjects assigned; a worker consumer without filters would receive the whole "
            "stream: delete the consumer instead (delete_worker_consumer) or assign subjects", reason="no_subjects")
    if len(unique) > max_subjects:
        raise TooManySubjectsError(
            f"{consumer}: {len(unique)} subjects assigned but at most {max_subjects} are allowed per worker "
            "consumer; spread the subjects over more workers, group them with a wildcard (orders.eu.*), or "
            "raise max_subjects",
        )
    for w in (s for s in unique if {"*", ">"} & set(s.split("."))):
        for other in unique:
            if other != w and subjects_overlap(w, other):
                raise InvalidSubjectError(
                    f"{consumer}: filter subjects {w!r} and {other!r} overlap; the server refuses overlapping "
                    "filters: keep only the wider one", reason="filter_subjects_overlap")
    return unique


def _update_transient(exc: JetStreamError) -> str | None:
    """What an update retries: no answer, a lost or unreachable server, a 503 (safe: the update is idempotent)."""
    if isinstance(exc, RequestTimeoutError):
        return "no answer"
    if isinstance(exc, ConnectionFailedError) and exc.reason in ("server_unreachable", "connection_lost"):
        return "no connection"
    return "server unavailable" if exc.code == 503 else None


async def ensure_worker_consumer(
    conn: JetStreamConnection,
    stream: str,
    prefix: str,
    worker_id: str | int,
    subjects: Iterable[str],
    *,
    max_subjects: int = DEFAULT_MAX_SUBJECTS,
    inactive_threshold: float | str | timedelta | None = "1h",
    config: dict[str, Any] | None = None,
    retries: int = 3,
    backoff: float = 0.5,
    max_backoff: float = 8.0,
) -> dict[str, Any]:
    """Create or update the durable pull consumer ``<prefix>-<worker_id>`` on ``stream`` so that it
    filters exactly ``subjects``.

    Returns ``{"action": "created"|"updated"|"unchanged", "consumer", "stream", "subjects",
    "changed", "attempts", "info"}``. ``config`` adds consumer settings by JetStream JSON name. Transient
    failures (no answer, a lost connection, a 503) are retried up to ``retries`` times, pausing ``backoff``
    seconds doubling up to ``max_backoff``, jittered; a lost connection is raised as
    :class:`ConnectionFailedError` (``connection_lost``). A failure leaves the previous config in place.
    """
    name = worker_consumer_name(prefix, worker_id)
    validate_name(stream, what="stream name")
    wanted = normalize_subjects(subjects, max_subjects=max_subjects, consumer=f"worker consumer {name!r}")
    owned = sorted(set(config or {}) & set(_OWNED_FIELDS))
    if owned:
        raise InvalidRequestError(
            f"worker consumer {name!r}: config may not set {', '.join(owned)}; the name comes from prefix and "
            "worker_id, the filters from subjects, and worker consumers are pull consumers", reason="invalid_field")
    cfg = {**DEFAULT_WORKER_CONFIG, **(config or {}), "durable_name": name, "filter_subjects": wanted}
    if inactive_threshold is not None:
        cfg["inactive_threshold"] = inactive_threshold
    if not isinstance(retries, int) or retries < 0:
        raise InvalidRequestError(f"retries must be an integer >= 0, got {retries!r}")
    started = time.monotonic()
    attempts = 0

    async def update() -> dict[str, Any]:
        nonlocal attempts
        attempts += 1
        try:
            result = await ensure_consumer(conn, stream, cfg)
            if consumer_filters(result["info"]) != wanted:
                # nats-server 2.15.1 answers the first update after a restart with the config from before the update
                # (while applying it), so the reply alone cannot be trusted there: read the consumer again
                result["info"] = await consumer_info(conn, stream, name)
            return result
        except _TRANSIENT_NATS_ERRORS as exc:
            raise ConnectionFailedError(f"worker consumer {name!r} on {stream!r}: the connection failed "
                                        f"({type(exc).__name__})", reason="connection_lost") from exc

    async def count_retry() -> None:
        metrics.incr("worker_consumer.update_retry", tags={"stream": stream})

    try:
        result = await retry(f"Worker consumer {name} on {stream}: update to {len(wanted)} subject(s)", update,
                             transient=_update_transient, budget=None, budget_name="retries", max_retries=retries,
                             backoff=Backoff(backoff, max_backoff, jitter=True), logger=log, before_retry=count_retry)
    except JetStreamError as exc:
        metrics.incr("worker_consumer.update_failed", tags={"stream": stream})
        log.warning("Worker consumer %s on %s: update to %d subject(s) failed after %d attempt(s); the consumer "
                    "keeps its previous config: %s", name, stream, len(wanted), attempts, exc)
        raise
    if consumer_filters(result["info"]) != wanted:
        raise ConsumerConfigError(
            f"worker consumer {name!r} on {stream!r}: the server accepted the update but still filters "
            f"{consumer_filters(result['info'])[:5]}...; another process may be updating the same consumer "
            "(worker ids must be unique)", reason="update_not_applied")
    metrics.timing("worker_consumer.update", (time.monotonic() - started) * 1000, tags={"stream": stream})
    metrics.gauge("worker_consumer.subjects", len(wanted), tags={"stream": stream, "consumer": name})
    metrics.incr(f"worker_consumer.{result['action']}", tags={"stream": stream})
    if result["action"] != "unchanged":
        log.info("Worker consumer %s on %s %s (%d subject(s), changed %s)", name, stream, result["action"],
                 len(wanted), ", ".join(result["changed"]))
    return {"action": result["action"], "consumer": name, "stream": stream, "subjects": wanted,
            "changed": result["changed"], "attempts": attempts, "info": result["info"]}


async def delete_worker_consumer(conn: JetStreamConnection, stream: str, prefix: str, worker_id: str | int) -> bool:
    """Delete a worker's consumer now (instead of waiting for its inactive threshold)."""
    return await delete_consumer(conn, stream, worker_consumer_name(prefix, worker_id))


class WorkerConsumerManager:
    """Keeps one worker's consumer in line with its assigned subjects, sending nothing for no-ops.

    The manager remembers the last subject set the server accepted (``subjects``, the last good
    config). :meth:`update` with the same set is suppressed locally (``stats["noop_suppressed"]``);
    a failed update keeps ``subjects`` as it was, remembers the wanted set in ``pending`` and
    raises; :meth:`retry_pending` (or the next :meth:`update`) tries again. It holds no connection:
    pass one per call, so it also works through ``JetStreamHook.run(manager.update, subjects)``.
    """

    def __init__(self, stream: str, prefix: str, worker_id: str | int, *,
                 max_subjects: int = DEFAULT_MAX_SUBJECTS,
                 inactive_threshold: float | str | timedelta | None = "1h",
                 config: dict[str, Any] | None = None, retries: int = 3, backoff: float = 0.5,
                 max_backoff: float = 8.0) -> None:
        self.stream = validate_name(stream, what="stream name")
        self.prefix = prefix
        self.worker_id = str(worker_id)
        self.name = worker_consumer_name(prefix, worker_id)
        self.options: dict[str, Any] = {
            "max_subjects": max_subjects, "inactive_threshold": inactive_threshold, "config": config,
            "retries": retries, "backoff": backoff, "max_backoff": max_backoff,
        }
        self.subjects: tuple[str, ...] | None = None
        self.pending: tuple[str, ...] | None = None
        self.last_error: dict[str, Any] | None = None
        self.stats = {"created": 0, "updated": 0, "unchanged": 0, "noop_suppressed": 0, "failed": 0}

    async def update(self, conn: JetStreamConnection, subjects: Iterable[str]) -> dict[str, Any]:
        """Apply an assignment. Returns the :func:`ensure_worker_consumer` result plus ``added``,
        ``removed`` (against the last good set) and ``suppressed`` (True when nothing was sent)."""
        wanted = tuple(normalize_subjects(subjects, max_subjects=self.options["max_subjects"],
                                          consumer=f"worker consumer {self.name!r}"))
        previous = self.subjects
        if wanted == previous and self.pending is None:
            self.stats["noop_suppressed"] += 1
            metrics.incr("worker_consumer.update_skipped", tags={"stream": self.stream})
            return {"action": "unchanged", "consumer": self.name, "stream": self.stream, "subjects": list(wanted),
                    "changed": [], "attempts": 0, "info": None, "added": [], "removed": [], "suppressed": True}
        try:
            result = await ensure_worker_consumer(conn, self.stream, self.prefix, self.worker_id, wanted,
                                                  **self.options)
        except JetStreamError as exc:  # ensure_worker_consumer raises a lost connection as one too
            self.pending, self.last_error = wanted, exc.to_dict()
            self.stats["failed"] += 1
            raise
        if result["action"] == "unchanged" and previous is not None and wanted != previous:
            result["action"] = "updated"  # an earlier attempt that timed out had applied it
        self.stats[result["action"]] += 1
        self.subjects, self.pending, self.last_error = wanted, None, None
        before = set(previous or ())
        return {**result, "added": sorted(set(wanted) - before), "removed": sorted(before - set(wanted)),
                "suppressed": False}

    async def retry_pending(self, conn: JetStreamConnection) -> dict[str, Any] | None:
        """Retry the last failed assignment; None when nothing is pending."""
        if self.pending is None:
            return None
        return await self.update(conn, self.pending)

