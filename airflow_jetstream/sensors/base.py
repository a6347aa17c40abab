"""What every JetStream sensor shares: the hook, one condition for poke and trigger, poke-then-defer, the timeout
and failure messages, SIGTERM; and the base of the sensors that wait for a state (caught up, drained, ledger, KV)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    AirflowTaskTerminated,
    AirflowTaskTimeout,
)
from airflow.triggers.base import StartTriggerArgs

from airflow_jetstream.airflow_compat import START_FROM_TRIGGER, require_airflow
from airflow_jetstream.client.errors import LeaderUnavailableError
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.operators.base import JetStreamConnected
from airflow_jetstream.triggers.base import JetStreamResultTrigger, JetStreamWaitTrigger

#: Airflow's own deferral timeout comes this many seconds after the trigger's (which reports the last state).
TIMEOUT_BACKSTOP = 60


class JetStreamBaseSensor(JetStreamConnected, BaseSensorOperator):
    """Base of the provider's sensors: ``nats_conn_id``, and ``deferrable`` defaulting to Airflow's
    ``[operators] default_deferrable``. Deferred, one poke first, then :meth:`deferred_trigger` waits in the
    triggerer; a poke-mode timeout adds ``_last_seen`` (one line of the last state).

    ``on_kill`` raises: Airflow's SIGTERM handler only calls it and carries on, and under ``airflow dags test``
    a deferred sensor's trigger runs inline in that process, so SIGTERM was ignored until SIGKILL. During an
    ``execution_timeout`` it returns, so the task fails with ``AirflowTaskTimeout`` and its retries apply.
    """

    #: The condition (see :meth:`make_trigger`).
    trigger_class: type[JetStreamWaitTrigger]
    #: seconds Airflow's deferral timeout adds to ``timeout`` (``TIMEOUT_BACKSTOP`` when the trigger has its own)
    defer_backstop: float = 0
    _last_seen: str | None = None
    _poked: JetStreamWaitTrigger | None = None

    def __init__(self, *, deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 nats_conn_id: str = JetStreamHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.nats_conn_id = nats_conn_id

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            try:
                return super().execute(context)
            except AirflowSensorTimeout as exc:
                if self._last_seen is None:
                    raise
                raise AirflowSensorTimeout(f"{exc} Last seen: {self._last_seen}") from None
        try:
            done = self.poke(context)
        except AirflowFailException as exc:  # as Airflow's poke mode: soft_fail/never_fail skip
            if self.soft_fail or self.never_fail:
                raise AirflowSkipException(f"skipped (soft_fail/never_fail): {exc}") from exc
            raise
        if done:  # a subclass's poke may return a plain bool, as Airflow's poke contract allows
            return done.xcom_value if isinstance(done, PokeReturnValue) else None
        self.defer(trigger=self.deferred_trigger(context), method_name="execute_complete",
                   timeout=timedelta(seconds=self.timeout + self.defer_backstop))

    def make_trigger(self, context: Any) -> JetStreamWaitTrigger:
        """The condition with this task's parameters: what each poke checks and what waits when deferred."""
        return self.trigger_class(**self._trigger_args(), nats_conn_id=self.nats_conn_id)

    def _trigger_args(self) -> dict[str, Any]:
        """The sensor's attributes named as ``trigger_class``'s serialized arguments (the same parameters)."""
        return {name: getattr(self, name) for name in self.trigger_class.serialized}

    def start_in_triggerer(self, trigger: JetStreamWaitTrigger) -> None:
        """Let the scheduler defer this task to ``trigger`` itself (``start_from_trigger``, Airflow 3.3+): its
        kwargs are the DAG file's values, rendered by the triggerer; the wait ends at Airflow's deferral timeout."""
        require_airflow(START_FROM_TRIGGER)
        classpath, trigger_kwargs = trigger.serialize()
        self.start_from_trigger = True
        self.start_trigger_args = StartTriggerArgs(
            trigger_cls=classpath, trigger_kwargs=trigger_kwargs, next_method="execute_complete", next_kwargs=None,
            timeout=timedelta(seconds=self.timeout))

    def poke(self, context: Any) -> PokeReturnValue:
        """One look through the trigger's own ``check`` (the condition is implemented once, in the trigger)."""
        trigger = self._poked = self.make_trigger(context)
        try:
            event = self.hook.run(trigger.check)
        except LeaderUnavailableError as exc:
            self.log.info("%s: not yet, the cluster is electing a leader (%s)", trigger.what, exc)
            return PokeReturnValue(False)
        self._last_seen = trigger.last_seen
        line = trigger.look_line(event is not None)
        if line:
            self.log.info("%s", line)
        self.checked(context, trigger)
        if event is None:
            return PokeReturnValue(False)
        return PokeReturnValue(True, self.execute_complete(context, event))

    def checked(self, context: Any, trigger: JetStreamWaitTrigger) -> None:
        """Called after each poke's look, before its result is handled (e.g. to report what the look noticed)."""

    def deferred_trigger(self, context: Any) -> JetStreamWaitTrigger:
        """The trigger that waits after a first poke found nothing, ending at the sensor's timeout."""
        trigger = self.make_trigger(context)
        trigger.timeout_at = (datetime.now(UTC) + timedelta(seconds=self.timeout)).isoformat()
        self.log.info("Deferring: waiting for %s in the triggerer", trigger.goal())
        return trigger

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """The result of the condition's event (a poke's or the trigger's): XCom value, or the task's failure."""
        raise NotImplementedError

    def on_kill(self) -> None:
        if isinstance(sys.exception(), AirflowTaskTimeout):
            return  # called by Airflow's execution_timeout handling: the timeout stands (and is retried)
        raise AirflowTaskTerminated(f"task {self.task_id!r} received SIGTERM while waiting: stopped")

    def timed_out(self, what: str, last_seen: str | None = None) -> NoReturn:
        """End a deferred wait whose trigger reported its deadline: skip with ``soft_fail``, else fail."""
        message = f"{what} within {self.timeout:.0f} s"
        if last_seen is not None:
            message += f". Last seen: {last_seen}"
        if self.soft_fail:
            raise AirflowSkipException(message)
        raise AirflowSensorTimeout(message)


class JetStreamStateSensor(JetStreamBaseSensor):
    """Base of the sensors whose condition's success is their result (a
    :class:`~airflow_jetstream.triggers.base.JetStreamResultTrigger`: a state polled until it is done, every
    ``poke_interval``, or a KV key): each poke runs its ``check``, and deferred it waits in the triggerer.

    ``start_from_trigger=True`` (Airflow 3.3+): the scheduler defers the task itself, with no worker until the
    trigger fires (then a worker runs only ``execute_complete``); the triggerer renders the templated fields.
    Airflow reads ``start_trigger_args`` when each ``__init__`` returns and when it serializes the DAG, so
    subclasses set their parameters *before* calling ``super().__init__``, which builds the trigger from them (the KV
    sensor, which checks its key and function first, builds its trigger itself after them).
    The wait then ends at Airflow's deferral timeout (``timeout``), which fails the task with
    ``AirflowSensorTimeout("Trigger timeout")``: the trigger's own deadline is an absolute time, unknown when
    the DAG is parsed, so the last state is in the triggerer's log rather than in the failure.

    ``end_from_trigger=True``: once the condition holds, the trigger stores the result as the XCom and ends the task
    as success, with no worker (:class:`~airflow_jetstream.triggers.base.JetStreamResultTrigger`); an error or a
    timeout still resumes the task here, in :meth:`execute_complete`.
    """

    defer_backstop = TIMEOUT_BACKSTOP  # the trigger reports its own timeout with the last state
    _last_seen = "nothing (no poke finished)"

    trigger_class: type[JetStreamResultTrigger]

    def __init__(self, *, start_from_trigger: bool = False, end_from_trigger: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.end_from_trigger = end_from_trigger
        if start_from_trigger:
            self.start_in_triggerer(self.make_trigger(None))

    def make_trigger(self, context: Any) -> JetStreamResultTrigger:
        """The condition with this task's parameters (a polling one's ``poll_interval`` is ``poke_interval``)."""
        polling = {"poll_interval": self.poke_interval} if "poll_interval" in self.trigger_class.common else {}
        return self.trigger_class(**self._trigger_args(), nats_conn_id=self.nats_conn_id,
                                  end_from_trigger=self.end_from_trigger, **polling)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        trigger = self.make_trigger(context)
        result = trigger.result(event)
        if result is not None:
            self.log.info("%s", trigger.done_line(result))
            return result
        status = event.get("status")
        if status == "error":
            raise failure(trigger.goal(), event.get("error") or {})
        if status == "timeout":
            self.timed_out(f"{trigger.goal()} not reached", event.get("description"))
        raise AirflowException(f"unexpected trigger event {event!r}")


def failure(what: str, error: dict[str, Any]) -> AirflowException:
    """The exception for waiting for ``what`` that failed with ``error`` (a ``JetStreamError.to_dict()``,
    a server API error, or the whole event when it carries no error)."""
    message = error.get("message") or error.get("description") or error
    return AirflowException(f"waiting for {what} failed: {message} "
                            f"(reason: {error.get('reason', error.get('err_code'))})")
