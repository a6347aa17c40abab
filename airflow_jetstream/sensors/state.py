"""The base of the sensors that wait for a JetStream state (caught up, drained, ledger batches done)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.common.compat.sdk import conf
from airflow.sdk.exceptions import AirflowException

from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.sensors.base import TIMEOUT_BACKSTOP, JetStreamBaseSensor, failure
from airflow_jetstream.triggers.base import JetStreamPollingTrigger


class JetStreamStateSensor(JetStreamBaseSensor):
    """Base of the sensors that poll a state until it is done. ``trigger()`` builds the condition (a
    :class:`~airflow_jetstream.triggers.base.JetStreamPollingTrigger`): each poke runs its ``check``, and
    deferred it polls in the triggerer."""

    template_fields: Sequence[str] = ("nats_conn_id",)
    ui_color = "#27aae1"
    what = "condition"
    defer_backstop = TIMEOUT_BACKSTOP  # the trigger reports its own timeout with the last state
    _last_seen = "nothing (no poke finished)"

    def __init__(self, *, deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 nats_conn_id: str = JetStreamHook.default_conn_name,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.nats_conn_id = nats_conn_id

    def trigger(self) -> JetStreamPollingTrigger:
        """The condition with this task's parameters (``poll_interval`` is the sensor's ``poke_interval``)."""
        raise NotImplementedError

    def make_trigger(self, context: Any) -> JetStreamPollingTrigger:
        return self.trigger()

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        status = event.get("status")
        if status == "success":
            result: dict[str, Any] = event["result"]
            self.log.info("Done: %s", self.trigger().describe(result))
            return result
        if status == "error":
            raise failure(self.what, event.get("error") or {})
        if status == "timeout":
            self.timed_out(f"{self.what} not reached", event.get("description"))
        raise AirflowException(f"unexpected trigger event {event!r}")
