"""JetStreamEnsureStreamOperator: idempotent create-or-update of a stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_jetstream.assets.jetstream import report_stream_output
from airflow_jetstream.client import metrics
from airflow_jetstream.client.admin.streams import ensure_stream, normalize_stream_config
from airflow_jetstream.operators.base import JetStreamBaseOperator


class JetStreamEnsureStreamOperator(JetStreamBaseOperator):
    """Create a stream, update it where it differs from ``config`` (JetStream's JSON names), or leave it alone.

    Unknown keys fail before any call; changing an immutable field fails naming the field. The stream is
    added to the task's outlets (``jetstream://<first server>/<stream>``) and reported to hook lineage, so
    DAGs scheduled on that asset run after this task. Returns the stream info; see docs/operators/stream.md.
    """

    template_fields: Sequence[str] = ("config",)
    template_fields_renderers = {"config": "json"}

    def __init__(self, *, config: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config

    def execute(self, context: Any) -> dict[str, Any]:
        config = normalize_stream_config(self.config)
        result = self.hook.run(ensure_stream, config)
        name = config["name"]
        metrics.incr("stream.ensured", tags={"action": result["action"]})
        report_stream_output(self, self.hook.settings.servers, name, lineage_context=self.hook)
        if result["action"] == "unchanged":
            self.log.info("Stream %s already matches the requested config: nothing to do", name)
        elif result["action"] == "created":
            self.log.info("Created stream %s (subjects %s)", name, config.get("subjects"))
        else:
            self.log.info("Updated stream %s: changed %s", name, ", ".join(result["changed"]))
        info = result["info"]
        return {
            "action": result["action"],
            "changed": result["changed"],
            "config": info["config"],
            "state": info.get("state", {}),
            "created": info.get("created"),
        }
