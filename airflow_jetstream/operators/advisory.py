"""JetStreamAdvisoryStreamOperator: ensure the stream that captures JetStream advisories."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.advisories.capture import (
    DEFAULT_CAPTURE_STREAM,
    DEFAULT_CAPTURE_SUBJECTS,
    capture_stream_config,
)
from airflow_jetstream.operators.base import JetStreamBaseOperator


class JetStreamAdvisoryStreamOperator(JetStreamBaseOperator):
    """Create (or bring up to date) the stream that stores advisories, so that none is missed.

    The server publishes advisories only while someone listens; this stream listens all the time
    and keeps them for ``max_age`` (and at most ``max_bytes``), so that
    ``JetStreamAdvisorySensor`` can look back to the start of a run. Idempotent: run it at the
    top of every DAG that waits on advisories, or once in a setup DAG::

        capture = JetStreamAdvisoryStreamOperator(task_id="capture_advisories", stream="ADVISORIES", max_age="7d")
        capture >> publish >> JetStreamAdvisorySensor(task_id="no_abandoned", advisory="batch_abandoned",
                                                      stream="ORDERS", expect="absent", quiet_period=30)

    :param stream: the capture stream's name (default ``ADVISORIES``). Templated.
    :param max_age: how long advisories are kept (``"7d"``, seconds as ns, or a timedelta). Templated.
    :param max_bytes: optional size cap; the oldest advisories are dropped first.
    :param subjects: subjects to capture (default ``$JS.EVENT.ADVISORY.>``).
    :param storage: ``file`` (default) or ``memory``.
    :param num_replicas: replicas in a cluster.
    :param nats_conn_id: the ``nats`` connection to use.
    """

    template_fields: Sequence[str] = ("stream", "max_age")
    ui_color = "#27aae1"

    def __init__(self, *, stream: str = DEFAULT_CAPTURE_STREAM, max_age: Any = "7d", max_bytes: int | None = None,
                 subjects: Sequence[str] = DEFAULT_CAPTURE_SUBJECTS, storage: str = "file", num_replicas: int = 1,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.max_age = max_age
        self.max_bytes = max_bytes
        self.subjects = list(subjects)
        self.storage = storage
        self.num_replicas = num_replicas

    def execute(self, context: Any) -> dict[str, Any]:
        config = capture_stream_config(self.stream, max_age=self.max_age, max_bytes=self.max_bytes,
                                       subjects=self.subjects, storage=self.storage, num_replicas=self.num_replicas)
        result = self.hook.run(ensure_stream, config)
        self.log.info("Advisory capture stream %s: %s%s", self.stream, result["action"],
                      f" ({', '.join(result['changed'])})" if result["action"] == "updated" else "")
        info = result["info"]
        return {
            "action": result["action"],
            "changed": result["changed"],
            "stream": self.stream,
            "subjects": info["config"].get("subjects"),
            "max_age": info["config"].get("max_age"),
            "max_bytes": info["config"].get("max_bytes"),
            "messages": info.get("state", {}).get("messages", 0),
        }
