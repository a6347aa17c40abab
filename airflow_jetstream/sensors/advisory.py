"""JetStreamAdvisorySensor: wait for a JetStream advisory, or guard that none shows up."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_jetstream.client.advisories.types import (
    DEFAULT_CAPTURE_STREAM,
    parse_timestamp,
    predicate_path,
)
from airflow_jetstream.client.durations import parse_time, to_seconds
from airflow_jetstream.sensors.base import TIMEOUT_BACKSTOP, JetStreamBaseSensor, failure
from airflow_jetstream.triggers.advisory import EXPECT_VALUES, FILTER_ARGS, JetStreamAdvisoryTrigger, filter_of
from airflow_jetstream.triggers.base import JetStreamWaitTrigger


class JetStreamAdvisorySensor(JetStreamBaseSensor):
    """Wait for a matching JetStream advisory and return it on XCom, or guard that none appears.

    Advisories are read from the capture stream (``JetStreamAdvisoryStreamOperator``) from ``start_time``
    (default: the run's data interval start, else its logical date), so one published before the sensor
    started is still found, across reschedules and deferral; ``capture_stream=None`` subscribes live and sees
    only what is published while it listens. ``expect="present"`` succeeds with the first match (its JSON fields
    plus ``advisory_kind``); ``expect="absent"`` is a guard: it fails on a match and succeeds once
    ``quiet_period`` passed with none. ``match`` may be a module-level function: it is stored by its dotted
    path, as triggers must serialize. Parameters and examples: docs/sensors/advisory.md.
    """

    template_fields: Sequence[str] = ("advisory", "advisory_stream", "advisory_consumer", "batch_id", "reason",
                                      "start_time", "capture_stream")
    defer_backstop = TIMEOUT_BACKSTOP

    def __init__(self, *, advisory: str | None, advisory_stream: str | None = None,
                 advisory_consumer: str | None = None, batch_id: str | None = None, reason: str | None = None,
                 match: dict[str, Any] | str | Callable[[dict[str, Any]], bool] | None = None,
                 start_time: datetime | str | None = None, expect: str = "present",
                 capture_stream: str | None = DEFAULT_CAPTURE_STREAM, quiet_period: float | str | timedelta = 60.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if expect not in EXPECT_VALUES:
            raise ValueError(f"expect must be one of {EXPECT_VALUES}, got {expect!r}")
        self.advisory = advisory
        self.advisory_stream = advisory_stream
        self.advisory_consumer = advisory_consumer
        self.batch_id = batch_id
        self.reason = reason
        self.match = predicate_path(match) if callable(match) else match
        self.start_time = start_time
        self.expect = expect
        self.capture_stream = capture_stream
        self.quiet_period = to_seconds(quiet_period, field="quiet_period")
        self._guard_started: datetime | None = None
        self._gap_reported = False
        self._last_seen = "nothing (no poke finished)"
        filters = (advisory, advisory_stream, advisory_consumer, batch_id, reason)
        if not any("{{" in str(value) for value in filters if value):
            filter_of(self)  # bad kinds, names and predicates fail when the DAG is parsed

    def resolve_since(self, context: Any) -> datetime:
        """``start_time``, else the run's data interval start, logical date or run_after, else now."""
        if self.start_time:
            return parse_time(self.start_time, field="start_time")
        dag_run = context.get("dag_run")
        for value in (context.get("data_interval_start"), context.get("logical_date"),
                      getattr(dag_run, "run_after", None)):
            if value:
                return parse_time(value, field="since")
        return datetime.now(UTC)

    def _quiet_until(self, context: Any) -> datetime:
        if self._guard_started is None:
            first = None
            if self.reschedule and context.get("ti") is not None:
                first = context["ti"].get_first_reschedule_date(context)
            self._guard_started = first or datetime.now(UTC)
        return self._guard_started + timedelta(seconds=self.quiet_period)

    def make_trigger(self, context: Any) -> JetStreamAdvisoryTrigger:
        since = self.resolve_since(context)
        quiet_until = self._quiet_until(context).isoformat() if self.expect == "absent" else None
        # report_gap=False: the sensor's first poke says it (once, and not for a run that made the stream)
        trigger = JetStreamAdvisoryTrigger(**{arg: getattr(self, arg) for arg in FILTER_ARGS}, expect=self.expect,
                                           start_time=since.isoformat(), capture_stream=self.capture_stream,
                                           quiet_until=quiet_until, nats_conn_id=self.nats_conn_id, report_gap=False)
        if not self.capture_stream and not self.deferrable:  # live mode: a poke listens, the trigger would
            trigger.listen_for = min(self.poke_interval, 60.0) or 1.0
        return trigger

    def checked(self, context: Any, trigger: JetStreamWaitTrigger) -> None:
        """Report a gap of the capture stream once per task; not as a warning when this DAG run created the capture
        stream (nothing of it was missed)."""
        gap = getattr(trigger, "gap", None)
        if not gap or self._gap_reported:
            return
        self._gap_reported = True
        run_start = getattr(context.get("dag_run"), "start_date", None)
        if run_start is not None and self.capture_stream:
            from airflow_jetstream.client.advisories.capture import capture_info

            created = parse_timestamp(self.hook.run(capture_info, self.capture_stream).get("created"))
            if created is not None and created >= parse_time(run_start, field="start_date"):
                self.log.info("Capture stream %r was created by this DAG run at %s: advisories are read from then on",
                              self.capture_stream, created.isoformat())
                return
        self.log.warning("%s", gap)

    def _guard_message(self, advisory: dict[str, Any]) -> str:
        details = ", ".join(f"{k}={advisory[k]}" for k in ("stream", "consumer", "batch", "reason", "stream_seq")
                            if advisory.get(k) is not None)
        return (f"guard failed: advisory {advisory.get('advisory_kind') or advisory.get('type')} ({details}) "
                f"at {advisory.get('timestamp')} matches {filter_of(self).describe()}")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        status = event.get("status")
        if status == "error":
            raise failure("the advisory", event.get("error") or {})
        if status == "matched":
            advisory = event["advisory"]
            if self.expect == "absent":
                raise AirflowFailException(self._guard_message(advisory))
            self.log.info("Found %s", advisory.get("advisory_kind") or advisory.get("type"))
            return advisory
        if status == "timeout":
            self.timed_out("advisory not found", event.get("description"))
        if status == "quiet" and self.expect == "absent":
            self.log.info("No matching advisory until %s: quiet period over", event.get("checked_until"))
            return {"expect": "absent", "advisory": None, "since": event.get("since"),
                    "checked_until": event.get("checked_until")}
        raise AirflowException(f"unexpected trigger event {event!r}")
