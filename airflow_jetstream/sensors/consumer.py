"""Sensors that wait until a source has caught up or a consumer is drained (poke or deferrable)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_jetstream.sensors.base import JetStreamStateSensor
from airflow_jetstream.triggers.consumer import JetStreamConsumerDrainedTrigger, JetStreamSourceCaughtUpTrigger


class JetStreamSourceCaughtUpSensor(JetStreamStateSensor):
    """Wait until ``stream`` has caught up with its source (or mirror) ``source``.

    Caught up: no source error, active, lag 0, and nothing pending or in flight on its durable consumer on the
    origin (every delivered message confirmed stored in ``stream``). A source error fails the task. Returns the
    source state; see docs/sensors/consumer.md.
    """

    template_fields: Sequence[str] = ("stream", "source", "domain", "api_prefix")
    trigger_class = JetStreamSourceCaughtUpTrigger

    def __init__(self, *, stream: str, source: str, domain: str | None = None, api_prefix: str | None = None,
                 **kwargs: Any) -> None:
        self.stream = stream
        self.source = source
        self.domain = domain
        self.api_prefix = api_prefix
        super().__init__(**kwargs)  # after the parameters: with start_from_trigger it builds the trigger


class JetStreamConsumerDrainedSensor(JetStreamStateSensor):
    """Wait until ``consumer`` on ``stream`` is drained: nothing pending, nothing awaiting an ack.

    Returns ``{"num_pending", "num_ack_pending", "delivered", "ack_floor", ...}``; see docs/sensors/consumer.md.
    """

    template_fields: Sequence[str] = ("stream", "consumer")
    trigger_class = JetStreamConsumerDrainedTrigger

    def __init__(self, *, stream: str, consumer: str, **kwargs: Any) -> None:
        self.stream = stream
        self.consumer = consumer
        super().__init__(**kwargs)  # after the parameters: with start_from_trigger it builds the trigger
