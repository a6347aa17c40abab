"""Sensors that wait until a source has caught up or a consumer is drained (poke or deferrable)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, AirflowSkipException

from airflow_jetstream.client.admin.consumers import consumer_status
from airflow_jetstream.client.errors import LeaderUnavailableError
from airflow_jetstream.client.sourcing.provision import source_status
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.sensors.base import _TerminableSensor
from airflow_jetstream.triggers.consumer import (
    JetStreamConsumerDrainedTrigger,
    JetStreamPollingTrigger,
    JetStreamSourceCaughtUpTrigger,
)
from airflow_jetstream.triggers.describe import describe_consumer, describe_source

#: Airflow's own deferral timeout comes this many seconds after the trigger's (which reports the last state).
TIMEOUT_BACKSTOP = 60


class _JetStreamStateSensor(_TerminableSensor):
    """Shared poke/defer logic: ``status()`` via the hook, ``trigger()`` for deferrable mode."""

    ui_color = "#27aae1"
    what = "condition"
    _last_seen = "nothing (no poke finished)"

    def __init__(self, *, deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 nats_conn_id: str = JetStreamHook.default_conn_name,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.nats_conn_id = nats_conn_id

    @cached_property
    def hook(self) -> JetStreamHook:
        return JetStreamHook(nats_conn_id=self.nats_conn_id)

    def status(self) -> dict[str, Any]:
        raise NotImplementedError

    def is_done(self, status: dict[str, Any]) -> bool:
        raise NotImplementedError

    def trigger(self) -> JetStreamPollingTrigger:
        raise NotImplementedError

    def poke(self, context: Any) -> PokeReturnValue:
        try:
            status = self.status()
        except LeaderUnavailableError as exc:
            self.log.info("%s: not yet, the cluster is electing a leader (%s)", self.what, exc)
            return PokeReturnValue(False)
        if status.get("error"):
            raise AirflowException(self._error_message(status["error"]))
        done = self.is_done(status)
        self._last_seen = self.describe(status)
        self.log.info("%s: %s", "Done" if done else "Not yet", self._last_seen)
        return PokeReturnValue(done, status if done else None)

    def describe(self, status: dict[str, Any]) -> str:
        """The state as one human line (what each poke logs and a timeout reports)."""
        return str(status)

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            try:
                return super().execute(context)
            except AirflowSensorTimeout as exc:
                raise AirflowSensorTimeout(f"{exc} Last seen: {self._last_seen}") from None
        done = self.poke(context)
        if done:
            return done.xcom_value
        self.log.info("Deferring: waiting for %s in the triggerer", self.what)
        trigger = self.trigger()
        # the trigger reports its own timeout with the last state; Airflow's (later) is only a backstop
        trigger.timeout_at = (datetime.now(UTC) + timedelta(seconds=self.timeout)).isoformat()
        self.defer(trigger=trigger, method_name="execute_complete",
                   timeout=timedelta(seconds=self.timeout + TIMEOUT_BACKSTOP))

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") == "success":
            self.log.info("Done: %s", self.describe(event["result"]))
            return event["result"]
        if event.get("status") == "error":
            raise AirflowException(self._error_message(event.get("error") or {}))
        if event.get("status") == "timeout":
            message = f"{self.what} not reached within {self.timeout:.0f} s. Last seen: {event.get('description')}"
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise AirflowSensorTimeout(message)
        raise AirflowException(f"unexpected trigger event {event!r}")

    def _error_message(self, error: dict[str, Any]) -> str:
        message = error.get("message") or error.get("description") or error
        return f"waiting for {self.what} failed: {message} (reason: {error.get('reason', error.get('err_code'))})"


class JetStreamSourceCaughtUpSensor(_JetStreamStateSensor):
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

    def status(self) -> dict[str, Any]:
        return self.hook.run(source_status, self.stream, self.source, domain=self.domain or None,
                             api_prefix=self.api_prefix or None)

    def is_done(self, status: dict[str, Any]) -> bool:
        return bool(status["caught_up"])

    def describe(self, status: dict[str, Any]) -> str:
        return describe_source(status)

    def trigger(self) -> JetStreamSourceCaughtUpTrigger:
        return JetStreamSourceCaughtUpTrigger(stream=self.stream, source=self.source, domain=self.domain or None,
                                              api_prefix=self.api_prefix or None,
                                              nats_conn_id=self.nats_conn_id, poll_interval=self.poke_interval)


class JetStreamConsumerDrainedSensor(_JetStreamStateSensor):
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

    def status(self) -> dict[str, Any]:
        return self.hook.run(consumer_status, self.stream, self.consumer)

    def is_done(self, status: dict[str, Any]) -> bool:
        return bool(status["drained"])

    def describe(self, status: dict[str, Any]) -> str:
        return describe_consumer(status)

    def trigger(self) -> JetStreamConsumerDrainedTrigger:
        return JetStreamConsumerDrainedTrigger(stream=self.stream, consumer=self.consumer,
                                               nats_conn_id=self.nats_conn_id, poll_interval=self.poke_interval)
