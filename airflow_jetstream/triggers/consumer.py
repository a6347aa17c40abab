"""Triggers that poll until a source has caught up or a consumer is drained."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_jetstream.client.admin.consumers import consumer_status
from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import JetStreamError, LeaderUnavailableError
from airflow_jetstream.client.sourcing.provision import source_status
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.triggers.describe import describe_consumer, describe_source


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


class JetStreamSourceCaughtUpTrigger(JetStreamPollingTrigger):
    """Fire when ``stream`` has caught up with its source/mirror ``source`` (lag 0, active, no error,
    nothing pending or in flight on the origin's consumer)."""

    what = "source caught up"

    def __init__(self, *, stream: str, source: str, domain: str | None = None, api_prefix: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.source = source
        self.domain = domain
        self.api_prefix = api_prefix

    def _kwargs(self) -> dict[str, Any]:
        return {"stream": self.stream, "source": self.source, "domain": self.domain, "api_prefix": self.api_prefix}

    async def status(self, conn: JetStreamConnection) -> dict[str, Any]:
        return await source_status(conn, self.stream, self.source, domain=self.domain, api_prefix=self.api_prefix)

    def is_done(self, status: dict[str, Any]) -> bool:
        return bool(status["caught_up"])

    def describe(self, status: dict[str, Any]) -> str:
        return describe_source(status)


class JetStreamConsumerDrainedTrigger(JetStreamPollingTrigger):
    """Fire when ``consumer`` on ``stream`` has nothing pending and nothing awaiting an ack."""

    what = "consumer drained"

    def __init__(self, *, stream: str, consumer: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.consumer = consumer

    def _kwargs(self) -> dict[str, Any]:
        return {"stream": self.stream, "consumer": self.consumer}

    async def status(self, conn: JetStreamConnection) -> dict[str, Any]:
        return await consumer_status(conn, self.stream, self.consumer)

    def is_done(self, status: dict[str, Any]) -> bool:
        return bool(status["drained"])

    def describe(self, status: dict[str, Any]) -> str:
        return describe_consumer(status)
