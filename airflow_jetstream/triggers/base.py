"""What the provider's triggers share: the polling base class and the retry policy for transient errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    AuthenticationError,
    ConnectionFailedError,
    JetStreamError,
    LeaderUnavailableError,
    RequestTimeoutError,
    TLSConfigurationError,
)
from airflow_jetstream.hooks.jetstream import JetStreamHook

#: Errors a busy or restarting server causes (e.g. hundreds of triggers starting at once): retried with backoff.
TRANSIENT_ERRORS = (RequestTimeoutError, ConnectionFailedError)
PERMANENT_ERRORS = (AuthenticationError, TLSConfigurationError)
TRANSIENT_RETRIES = 5


async def retrying(log: logging.Logger, what: str, attempt: Callable[[], Awaitable[dict[str, Any]]],
                   transient: tuple[type[JetStreamError], ...] = TRANSIENT_ERRORS) -> dict[str, Any]:
    """``await attempt()`` until it returns an event: a leader election is waited out (1 s steps, bounded by
    the caller's deadline), a ``transient`` error retried with backoff up to ``TRANSIENT_RETRIES`` times;
    any other error is the event ``{"status": "error", "error": {...}}``."""
    failures = 0
    while True:
        try:
            return await attempt()
        except LeaderUnavailableError as exc:
            log.info("%s: the cluster is electing a leader (%s); retrying in 1 s", what, exc)
            await asyncio.sleep(1.0)
        except JetStreamError as exc:
            failures += 1
            if not isinstance(exc, transient) or isinstance(exc, PERMANENT_ERRORS) or failures > TRANSIENT_RETRIES:
                log.error("%s failed (attempt %d): %s", what, failures, exc)
                return {"status": "error", "error": exc.to_dict()}
            delay = min(2.0**failures, 30.0)
            log.warning("%s interrupted (%s); retrying in %.0f s", what, exc, delay)
            await asyncio.sleep(delay)


class JetStreamPollingTrigger(BaseTrigger):
    """Poll ``status()`` every ``poll_interval`` seconds on one connection until ``is_done``.

    Events: ``{"status": "success", "result": {...}}``, ``{"status": "error", "error": {...}}`` or, once
    ``timeout_at`` (ISO time) passed, ``{"status": "timeout", "last": {...}, "description": "<last state>"}``.
    """

    what = "condition"

    def __init__(self, *, nats_conn_id: str = JetStreamHook.default_conn_name,
                 poll_interval: float | str | timedelta = 5.0, timeout_at: str | None = None) -> None:
        super().__init__()
        self.nats_conn_id = nats_conn_id
        self.poll_interval = to_seconds(poll_interval, field="poll_interval")
        self.timeout_at = timeout_at

    def _kwargs(self) -> dict[str, Any]:
        raise NotImplementedError

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {**self._kwargs(), "nats_conn_id": self.nats_conn_id, "poll_interval": self.poll_interval,
                 "timeout_at": self.timeout_at})

    def describe(self, status: dict[str, Any]) -> str:
        """The state as one human line."""
        return str(status)

    def _timed_out(self) -> bool:
        return self.timeout_at is not None and datetime.now(UTC) >= datetime.fromisoformat(self.timeout_at)

    async def status(self, conn: JetStreamConnection) -> dict[str, Any]:
        raise NotImplementedError

    def is_done(self, status: dict[str, Any]) -> bool:
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # the event is yielded after the connection is closed: a generator closed right after its first
        # event (``airflow dags test`` runs triggers inline that way) has nothing left to clean up
        yield TriggerEvent(await self._wait())

    async def _wait(self) -> dict[str, Any]:
        try:
            settings = await JetStreamHook(nats_conn_id=self.nats_conn_id).aget_settings()
            async with open_connection(settings) as conn:
                while True:
                    try:
                        status = await self.status(conn)
                    except LeaderUnavailableError as exc:
                        self.log.info("Waiting for %s: the cluster is electing a leader (%s)", self.what, exc)
                        await asyncio.sleep(self.poll_interval)
                        continue
                    if status.get("error") and isinstance(status["error"], dict):
                        return {"status": "error", "error": {**status["error"], "state": status}}
                    if self.is_done(status):
                        return {"status": "success", "result": status}
                    if self._timed_out():
                        return {"status": "timeout", "last": status, "description": self.describe(status)}
                    self.log.info("Waiting for %s: %s", self.what, self.describe(status))
                    await asyncio.sleep(self.poll_interval)
        except JetStreamError as exc:
            self.log.error("Waiting for %s failed: %s", self.what, exc)
            return {"status": "error", "error": exc.to_dict()}
