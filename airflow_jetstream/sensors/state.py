"""The base of the sensors that wait for a JetStream state (caught up, drained, ledger batches done)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowException

from airflow_jetstream.client.errors import LeaderUnavailableError
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.sensors.base import TIMEOUT_BACKSTOP, JetStreamBaseSensor, deadline, failure
from airflow_jetstream.triggers.base import JetStreamPollingTrigger


class JetStreamStateSensor(JetStreamBaseSensor):
    """Base of the sensors that poll a state until it is done: ``status()`` via the hook in poke mode,
    ``trigger()`` (a :class:`~airflow_jetstream.triggers.base.JetStreamPollingTrigger`) when deferred."""

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
            raise failure(self.what, status["error"])
        done = self.is_done(status)
        self._last_seen = self.describe(status)
        self.log.info("%s: %s", "Done" if done else "Not yet", self._last_seen)
        return PokeReturnValue(done, status if done else None)

    def describe(self, status: dict[str, Any]) -> str:
        """The state as one human line (what each poke logs and a timeout reports)."""
        return str(status)

    def deferred_trigger(self, context: Any) -> JetStreamPollingTrigger:
        self.log.info("Deferring: waiting for %s in the triggerer", self.what)
        trigger = self.trigger()
        trigger.timeout_at = deadline(self.timeout)
        return trigger

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") == "success":
            self.log.info("Done: %s", self.describe(event["result"]))
            return event["result"]
        if event.get("status") == "error":
            raise failure(self.what, event.get("error") or {})
        if event.get("status") == "timeout":
            self.timed_out(f"{self.what} not reached", event.get("description"))
        raise AirflowException(f"unexpected trigger event {event!r}")
