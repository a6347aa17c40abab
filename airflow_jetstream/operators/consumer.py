"""JetStreamConsumerResetOperator: reset a consumer to its ack floor, a sequence or a point in time."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from airflow_jetstream.client.admin.consumers import reset_consumer
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.operators.base import JetStreamBaseOperator


class JetStreamConsumerResetOperator(JetStreamBaseOperator):
    """Reset a consumer's delivery state, for replays and backfills.

    - no ``seq``/``time``: back to the ack floor (pending messages are delivered again);
    - ``seq``: the next message delivered is the first with stream sequence >= ``seq``
      (backward replays or forward skips; needs deliver policy all, by_start_sequence or by_start_time);
    - ``time``: the same from the first message stored at or after ``time`` (ISO 8601, naive = UTC).

    An unknown stream or consumer fails at once (the server itself would never answer), and resets
    the consumer's deliver policy or start forbid fail with the reason. Returns
    ``{"reset_seq", "delivered", "ack_floor", "num_pending", "num_ack_pending", ...}``::

        JetStreamConsumerResetOperator(
            task_id="replay_day",
            stream="ORDERS",
            consumer="billing",
            time="{{ data_interval_start }}",
        )

    :param stream: the stream (templated).
    :param consumer: the durable consumer (templated).
    :param seq: stream sequence to restart from (templated; int or digits).
    :param time: restart from the first message at or after this time (templated; ISO 8601 or datetime).
    :param nats_conn_id: the ``nats`` connection to use.
    """

    template_fields: Sequence[str] = ("stream", "consumer", "seq", "time")
    ui_color = "#27aae1"

    def __init__(self, *, stream: str, consumer: str, seq: int | str | None = None,
                 time: str | datetime | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.consumer = consumer
        self.seq = seq
        self.time = time

    def _seq(self) -> int | None:
        seq = self.seq
        if seq is None or seq == "":
            return None
        if isinstance(seq, str):
            if not seq.strip().isdigit():
                raise InvalidRequestError(f"seq must be a stream sequence (digits), got {seq!r}", reason="invalid_seq")
            return int(seq)
        return seq

    def execute(self, context: Any) -> dict[str, Any]:
        seq = self._seq()
        when = self.time or None
        if seq is not None and when is not None:
            raise InvalidRequestError("give either seq or time, not both", reason="invalid_reset")
        target = f"sequence {seq}" if seq is not None else f"time {when}" if when is not None else "its ack floor"
        self.log.info("Resetting consumer %s on stream %s to %s", self.consumer, self.stream, target)
        result = self.hook.run(reset_consumer, self.stream, self.consumer, seq=seq, time=when)
        self.log.info("Consumer %s reset: next stream sequence %s, %s pending, ack floor %s", self.consumer,
                      result["reset_seq"], result["num_pending"], result["ack_floor"].get("stream_seq"))
        return result
