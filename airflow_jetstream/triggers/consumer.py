"""Triggers that poll until a source has caught up or a consumer is drained."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.admin.consumers import consumer_status
from airflow_jetstream.triggers.base import JetStreamPollingTrigger
from airflow_jetstream.triggers.describe import describe_consumer, describe_source

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

__all__ = ["JetStreamConsumerDrainedTrigger", "JetStreamPollingTrigger", "JetStreamSourceCaughtUpTrigger"]


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
        from airflow_jetstream.client.sourcing.status import source_status

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
