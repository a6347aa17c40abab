"""JetStreamMessageSensor: wait until a message satisfies a function, as the Kafka provider's AwaitMessageSensor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import JetStreamError
from airflow_jetstream.client.reading.apply_function import function_path, load_function
from airflow_jetstream.client.subjects import validate_name, validate_subject
from airflow_jetstream.sensors.base import JetStreamBaseSensor, failure
from airflow_jetstream.triggers.await_message import JetStreamAwaitMessageTrigger

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection


class JetStreamMessageSensor(JetStreamBaseSensor):
    """Wait until a message of ``stream`` (on ``filter_subject``) satisfies ``apply_function``; push it to XCom.

    ``apply_function(message, *args, **kwargs)`` gets a :class:`~airflow_jetstream.client.reading.messages.Message`;
    a truthy result is a match, returned as ``{"stream", "subject", "seq", "headers", "data", "encoding", "time",
    "delivered"}`` plus ``result`` when it is not ``True``. Nothing is consumed: the stream is only read.
    ``start``: ``"new"`` (stored after the sensor started; in reschedule mode after its first poke), ``"first"``,
    a sequence or a time; each poke resumes after the last message it looked at. ``fetch_timeout`` is unused
    (accepted so that DAGs keep parsing). The trigger's event carries only where the message is, since Airflow's
    triggerer logs every event, and the task reads the message back (``message_gone`` when it is no longer
    stored); ``body_in_event=True`` carries the whole message instead. See docs/sensors/message.md.
    """

    template_fields: Sequence[str] = ("stream", "filter_subject", "start", "apply_function_args",
                                      "apply_function_kwargs")

    def __init__(self, *, stream: str, apply_function: Callable[..., Any] | str,
                 apply_function_args: Sequence[Any] | None = None, apply_function_kwargs: dict[str, Any] | None = None,
                 filter_subject: str | None = None, start: int | str | datetime = "new",
                 fetch_timeout: float | str | timedelta | None = None, body_in_event: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.apply_function = function_path(apply_function) if self.deferrable else apply_function
        load_function(self.apply_function)  # a bad function fails when the DAG is parsed
        if "{{" not in str(stream):
            validate_name(stream, what="stream name")
        if filter_subject is not None and "{{" not in str(filter_subject):
            validate_subject(filter_subject, allow_wildcards=True, what="filter_subject")
        self.stream = stream
        self.filter_subject = filter_subject
        self.apply_function_args = apply_function_args
        self.apply_function_kwargs = apply_function_kwargs
        self.start = start
        self.fetch_timeout = to_seconds(5.0 if fetch_timeout is None else fetch_timeout, field="fetch_timeout")
        self.body_in_event = body_in_event
        self._first_seq: int | None = None

    def _start_seq(self, context: Any) -> int:
        if self._poked is not None:  # resume after what the last poke looked at
            return cast(JetStreamAwaitMessageTrigger, self._poked).start_seq
        if self._first_seq is None:
            start = self.start
            if start == "new" and self.reschedule and context.get("ti") is not None:
                start = context["ti"].get_first_reschedule_date(context) or start  # the first poke's start
            from airflow_jetstream.client.reading.read_plan import resolve_start

            self._first_seq = self.hook.run(resolve_start, self.stream, start)
        return self._first_seq

    def make_trigger(self, context: Any) -> JetStreamAwaitMessageTrigger:
        return JetStreamAwaitMessageTrigger(
            stream=self.stream, apply_function=self.apply_function, start_seq=self._start_seq(context),
            filter_subject=self.filter_subject or None, apply_function_args=self.apply_function_args,
            apply_function_kwargs=self.apply_function_kwargs, nats_conn_id=self.nats_conn_id,
            body_in_event=self.body_in_event,
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") == "matched" and event.get("message"):
            message: dict[str, Any] = event["message"]
            if "encoding" not in message:  # a reference (the body stays out of the triggerer's log): read it here
                message = self.hook.run(self._read_back, message)
            self.log.info("Matched message seq %s on %s", message["seq"], message["subject"])
            return message
        if event.get("status") == "timeout":
            self.timed_out(f"no message of stream {self.stream} matched")
        raise failure("a message", event.get("error") or event)

    async def _read_back(self, conn: JetStreamConnection, reference: dict[str, Any]) -> dict[str, Any]:
        """The referenced message as the sensor returns it, with the function's result computed again here."""
        from airflow_jetstream.client.reading.apply_function import bind_function, call_function, with_result
        from airflow_jetstream.client.reading.stored import get_message

        stored = await get_message(conn, reference["stream"], seq=reference["seq"])
        if stored is None:
            raise JetStreamError(
                f"message {reference['seq']} of stream {reference['stream']!r} matched but is no longer stored when "
                "the task reads it (the stream's retention or max_age removed it): keep messages longer, or pass "
                "body_in_event=True to carry the body in the trigger's event", reason="message_gone")
        match = bind_function(self.apply_function, self.apply_function_args, self.apply_function_kwargs)
        message = {**stored.to_dict(), "delivered": reference.get("delivered", 1)}
        return with_result(message, await call_function(match, stored))
