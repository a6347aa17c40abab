"""Triggers that poll until a source has caught up or a consumer is drained, and their one human log line per state
(for sensors and triggers alike)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.admin.consumers import consumer_status
from airflow_jetstream.triggers.base import JetStreamPollingTrigger

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

__all__ = ["JetStreamConsumerDrainedTrigger", "JetStreamPollingTrigger", "JetStreamSourceCaughtUpTrigger"]


def human_duration(seconds: float) -> str:
    """``0.25`` -> ``"250 ms"``, ``42.0`` -> ``"42.0 s"``, ``5400`` -> ``"90 min"``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 600:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.0f} min"


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('description') or error.get('message') or error} (err_code {error.get('err_code')})"
    return str(error)


def describe_source(status: dict[str, Any]) -> str:
    """``AGG <- RAW: not caught up (lag 120 message(s), 30 pending on JS_SRC_x, last active 80 ms ago)``."""
    active = status.get("active")
    seen = "never active" if active is None or active < 0 else f"last active {human_duration(active / 1e9)} ago"
    kind = "mirror of" if status.get("mirror") else "<-"
    parts = [f"lag {status.get('lag')} message(s)"]
    if status.get("consumer_num_pending") is not None:
        parts.append(f"{status['consumer_num_pending']} pending on {status.get('consumer')}")
    if status.get("consumer_num_ack_pending"):
        parts.append(f"{status['consumer_num_ack_pending']} in flight (delivered, not yet confirmed stored)")
    parts.append(seen)
    line = (f"{status.get('stream')} {kind} {status.get('source')}: "
            f"{'caught up' if status.get('caught_up') else 'not caught up'} ({', '.join(parts)})")
    if status.get("error"):
        line += f"; source error: {_error_text(status['error'])}"
    if status.get("origin_left_behind"):
        line += (f"; {status.get('source')} still holds {status['origin_left_behind']} message(s) its consumer will "
                 "not deliver again (docs/sourcing.md: Messages left in a WorkQueue origin)")
    return line


def describe_consumer(status: dict[str, Any]) -> str:
    """``ORDERS/billing: not drained (12 pending, 3 awaiting ack, 1 redelivered, acked up to stream seq 88)``."""
    floor = (status.get("ack_floor") or {}).get("stream_seq")
    line = (f"{status.get('stream')}/{status.get('consumer')}: {'drained' if status.get('drained') else 'not drained'} "
            f"({status.get('num_pending')} pending, {status.get('num_ack_pending')} awaiting ack, "
            f"{status.get('num_redelivered')} redelivered, acked up to stream seq {floor})")
    return line + (" [paused]" if status.get("paused") else "")


class JetStreamSourceCaughtUpTrigger(JetStreamPollingTrigger):
    """Fire when ``stream`` has caught up with its source/mirror ``source`` (lag 0, active, no error,
    nothing pending or in flight on the origin's consumer)."""

    what = "source caught up"
    done_when = "caught_up"
    serialized = ("stream", "source", "domain", "api_prefix")

    def __init__(self, *, stream: str, source: str, domain: str | None = None, api_prefix: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.source = source
        self.domain = domain or None  # a rendered template of an unset field is ""
        self.api_prefix = api_prefix or None

    async def status(self, conn: JetStreamConnection) -> dict[str, Any]:
        from airflow_jetstream.client.sourcing.spec import source_status

        return await source_status(conn, self.stream, self.source, domain=self.domain, api_prefix=self.api_prefix)

    describe = staticmethod(describe_source)


class JetStreamConsumerDrainedTrigger(JetStreamPollingTrigger):
    """Fire when ``consumer`` on ``stream`` has nothing pending and nothing awaiting an ack."""

    what = "consumer drained"
    done_when = "drained"
    serialized = ("stream", "consumer")

    def __init__(self, *, stream: str, consumer: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.consumer = consumer

    async def status(self, conn: JetStreamConnection) -> dict[str, Any]:
        return await consumer_status(conn, self.stream, self.consumer)

    describe = staticmethod(describe_consumer)
