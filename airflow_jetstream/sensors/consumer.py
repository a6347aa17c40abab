"""Sensors that wait until a source has caught up or a consumer is drained (poke or deferrable)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_jetstream.sensors.base import JetStreamStateSensor
from airflow_jetstream.triggers.consumer import JetStreamConsumerDrainedTrigger, JetStreamSourceCaughtUpTrigger


class JetStreamSourceCaughtUpSensor(JetStreamStateSensor):
    """Wait until ``stream`` has caught up with its source (or mirror) ``source``.

    Caught up: the source has no error, is active, its lag is 0 and its durable consumer on the
    origin has nothing pending and nothing in flight (``num_ack_pending`` 0: every delivered message is
    confirmed stored in ``stream``). A source error (e.g. a consumer that is not a flow-control one)
    fails the task. Returns the source state; chain the next task after it::

        caught_up = JetStreamSourceCaughtUpSensor(
            task_id="agg_caught_up", stream="AGG", source="ORDERS_EDGE", domain="edge",
            deferrable=True, poke_interval=10, timeout=3600,
        )
        provision >> publish >> caught_up >> spark_consume

    :param stream: the aggregate stream (templated).
    :param source: the origin stream (templated).
    :param domain: the origin's JetStream domain, if not the connection's (templated).
    :param deferrable: wait in the triggerer (``JetStreamSourceCaughtUpTrigger``); default
        ``[operators] default_deferrable``.
    :param nats_conn_id: the ``nats`` connection to use.
    """

    template_fields: Sequence[str] = ("stream", "source", "domain", "api_prefix", "nats_conn_id")
    what = "source caught up"

    def __init__(self, *, stream: str, source: str, domain: str | None = None, api_prefix: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.source = source
        self.domain = domain
        self.api_prefix = api_prefix

    def trigger(self) -> JetStreamSourceCaughtUpTrigger:
        return JetStreamSourceCaughtUpTrigger(stream=self.stream, source=self.source, domain=self.domain or None,
                                              api_prefix=self.api_prefix or None,
                                              nats_conn_id=self.nats_conn_id, poll_interval=self.poke_interval)


class JetStreamConsumerDrainedSensor(JetStreamStateSensor):
    """Wait until ``consumer`` on ``stream`` is drained: nothing pending, nothing awaiting an ack.

    Returns ``{"num_pending", "num_ack_pending", "delivered", "ack_floor", ...}``::

        drained = JetStreamConsumerDrainedSensor(
            task_id="billing_drained", stream="ORDERS", consumer="billing",
            mode="reschedule", poke_interval=30,
        )

    :param stream: the stream (templated).
    :param consumer: the durable consumer (templated).
    :param deferrable: wait in the triggerer (``JetStreamConsumerDrainedTrigger``); default
        ``[operators] default_deferrable``.
    :param nats_conn_id: the ``nats`` connection to use.
    """

    template_fields: Sequence[str] = ("stream", "consumer", "nats_conn_id")
    what = "consumer drained"

    def __init__(self, *, stream: str, consumer: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.consumer = consumer

    def trigger(self) -> JetStreamConsumerDrainedTrigger:
        return JetStreamConsumerDrainedTrigger(stream=self.stream, consumer=self.consumer,
                                               nats_conn_id=self.nats_conn_id, poll_interval=self.poke_interval)
