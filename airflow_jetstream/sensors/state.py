"""The base of the sensors that wait for a JetStream state (caught up, drained, ledger batches done)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, AirflowSkipException

from airflow_jetstream.client.errors import LeaderUnavailableError
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.sensors.base import TIMEOUT_BACKSTOP, JetStreamBaseSensor
from airflow_jetstream.triggers.base import JetStreamPollingTrigger


class JetStreamStateSensor(JetStreamBaseSensor):
    """Base of the sensors that poll a state until it is done: ``status()`` via the hook in poke mode,
    ``trigger()`` (a :class:`~airflow_jetstream.triggers.base.JetStreamPollingTrigger`) when deferred."""

    template_fields: Sequence[str] = ("nats_conn_id",)
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
