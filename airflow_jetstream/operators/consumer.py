"""JetStreamConsumerResetOperator: reset a consumer to its ack floor, a sequence or a point in time."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from airflow_jetstream.client.admin.consumers import reset_consumer
from airflow_jetstream.operators.base import JetStreamBaseOperator, templated_int
from airflow_jetstream.ui.links import JetStreamViewLink


class JetStreamConsumerResetOperator(JetStreamBaseOperator):
    """Reset a consumer's delivery state, for replays and backfills: to its ack floor (no ``start_seq`` or
    ``start_time``), to a stream sequence, or to the first message stored at or after a time.

    An unknown stream or consumer fails at once (the server itself would never answer). Returns
    ``{"reset_seq", "delivered", "ack_floor", "num_pending", ...}``; see docs/operators/consumer.md.
    """

    template_fields: Sequence[str] = ("stream", "consumer", "start_seq", "start_time")
    operator_extra_links = (JetStreamViewLink(),)

    def __init__(self, *, stream: str, consumer: str, start_seq: int | str | None = None,
                 start_time: str | datetime | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.consumer = consumer
        self.start_seq = start_seq
        self.start_time = start_time

    def execute(self, context: Any) -> dict[str, Any]:
        seq = templated_int(self.start_seq, "start_seq", reason="invalid_seq")
        when = self.start_time or None  # both given: reset_consumer refuses it (invalid_reset) before any call
        target = f"sequence {seq}" if seq is not None else f"time {when}" if when is not None else "its ack floor"
        self.log.info("Resetting consumer %s on stream %s to %s", self.consumer, self.stream, target)
        result = self.hook.run(reset_consumer, self.stream, self.consumer, seq=seq, time=when)
        self.log.info("Consumer %s reset: next stream sequence %s, %s pending, ack floor %s", self.consumer,
                      result["reset_seq"], result["num_pending"], result["ack_floor"].get("stream_seq"))
        return result
