"""JetStreamAdvisoryStreamOperator: ensure the stream that captures JetStream advisories."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_jetstream.client.advisories.types import DEFAULT_CAPTURE_STREAM
from airflow_jetstream.operators.base import JetStreamBaseOperator


class JetStreamAdvisoryStreamOperator(JetStreamBaseOperator):
    """Create (or bring up to date) the stream that stores advisories, so that none is missed.

    The server publishes advisories only while someone listens; this stream listens all the time, so that
    ``JetStreamAdvisorySensor`` can look back to the start of a run. Options left unset keep what an existing
    stream has: a re-run never turns an R3 capture stream into R1 or shortens its ``max_age``. Each triggerer
    process holds one consumer on it (``max_consumers``). See docs/operators/advisory.md.
    """

    template_fields: Sequence[str] = ("capture_stream", "max_age", "num_replicas", "placement")

    def __init__(self, *, capture_stream: str | None = None, max_age: Any = None, max_bytes: int | None = None,
                 subjects: Sequence[str] | None = None, storage: str | None = None, num_replicas: int | None = None,
                 placement: dict[str, Any] | None = None, max_consumers: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.capture_stream = capture_stream or DEFAULT_CAPTURE_STREAM
        self.max_age = max_age
        self.max_bytes = max_bytes
        self.subjects = None if subjects is None else list(subjects)
        self.storage = storage
        self.num_replicas = num_replicas
        self.placement = placement
        self.max_consumers = max_consumers

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_jetstream.client.advisories.capture import ensure_capture_stream

        max_age = None if self.max_age == "" else self.max_age
        result = self.hook.run(ensure_capture_stream, self.capture_stream, max_age=max_age, max_bytes=self.max_bytes,
                               subjects=self.subjects, storage=self.storage, num_replicas=self.num_replicas,
                               placement=self.placement, max_consumers=self.max_consumers)
        info = result["info"]
        replicas = info["config"].get("num_replicas", 1)
        self.log.info("Advisory capture stream %s: %s%s, %d replica(s)", self.capture_stream, result["action"],
                      f" ({', '.join(result['changed'])})" if result["action"] == "updated" else "", replicas)
        return {
            "action": result["action"],
            "changed": result["changed"],
            "stream": self.capture_stream,
            "subjects": info["config"].get("subjects"),
            "max_age": _seconds(info["config"].get("max_age", 0)),
            "max_bytes": info["config"].get("max_bytes"),
            "num_replicas": replicas,
            "placement": info["config"].get("placement"),
            "max_consumers": info["config"].get("max_consumers"),
            "messages": info.get("state", {}).get("messages", 0),
        }


def _seconds(nanos: int) -> int | float:
    """A server duration (nanoseconds) as the seconds the operator takes: XCom speaks seconds too."""
    seconds = nanos / 1e9
    return int(seconds) if seconds.is_integer() else seconds
