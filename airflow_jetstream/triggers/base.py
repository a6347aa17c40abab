"""What the provider's triggers share: the polling base class and the retry policy for transient errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    AuthenticationError,
    ConnectionFailedError,
    JetStreamError,
    LeaderUnavailableError,
    RequestTimeoutError,
    TLSConfigurationError,
)
from airflow_jetstream.client.retry import Backoff, retry
from airflow_jetstream.hooks.jetstream import JetStreamHook

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

#: Errors a busy or restarting server causes (e.g. hundreds of triggers starting at once, a leader election).
TRANSIENT_ERRORS = (RequestTimeoutError, ConnectionFailedError)
PERMANENT_ERRORS = (AuthenticationError, TLSConfigurationError)
#: The triggers' one policy: a transient error is retried up to ``TRANSIENT_RETRIES`` times, 1 s doubling up to 30 s.
TRANSIENT_RETRIES = 5
TRIGGER_BACKOFF = Backoff(1.0, 30.0)


async def retrying(log: logging.Logger, what: str, attempt: Callable[[], Awaitable[dict[str, Any]]],
                   transient: tuple[type[JetStreamError], ...] = TRANSIENT_ERRORS) -> dict[str, Any]:
    """``await attempt()`` until it returns an event, with the client's retry rule
    (:func:`~airflow_jetstream.client.retry.retry`): a ``transient`` error (a leader election included) is
    retried up to ``TRANSIENT_RETRIES`` times, 1 s doubling up to 30 s, within the caller's deadline; any other
    error, or the last one, is the event ``{"status": "error", "error": {...}}``. Each attempt borrows the
    loop's pooled connection (``shared_connection``), so a retry after a lost connection gets a new one."""

    def why(exc: JetStreamError) -> str | None:
        if isinstance(exc, PERMANENT_ERRORS) or not isinstance(exc, transient):
            return None
        return "the cluster is electing a leader" if isinstance(exc, LeaderUnavailableError) else "interrupted"

    try:
        return await retry(what, attempt, transient=why, budget=None, budget_name="retries",
                           max_retries=TRANSIENT_RETRIES, backoff=TRIGGER_BACKOFF, logger=log)
    except JetStreamError as exc:
        log.error("%s failed: %s", what, exc)
        return {"status": "error", "error": exc.to_dict()}


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
        return await retrying(self.log, f"Waiting for {self.what}", self._poll)

    async def _poll(self) -> dict[str, Any]:
        from airflow_jetstream.client.connection_pool import shared_connection

        settings = await JetStreamHook(nats_conn_id=self.nats_conn_id).aget_settings()
        async with shared_connection(settings) as conn:
            while True:
                status = await self.status(conn)
                if status.get("error") and isinstance(status["error"], dict):
                    return {"status": "error", "error": {**status["error"], "state": status}}
                if self.is_done(status):
                    return {"status": "success", "result": status}
                if self._timed_out():
                    return {"status": "timeout", "last": status, "description": self.describe(status)}
                self.log.info("Waiting for %s: %s", self.what, self.describe(status))
                await asyncio.sleep(self.poll_interval)
