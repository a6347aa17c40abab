"""JetStreamAwaitMessageTrigger: a message of a stream satisfies a function (waited for in the triggerer)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.triggers.base import JetStreamWaitTrigger

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection
    from airflow_jetstream.client.reading.apply_function import FunctionSpec


#: What a matched message's event carries by default: where the message is, not what it says.
MESSAGE_REFERENCE = ("stream", "subject", "seq", "time", "delivered")


class JetStreamAwaitMessageTrigger(JetStreamWaitTrigger):
    """Fire once a message of ``stream`` (on ``filter_subject``) from ``start_seq`` on satisfies ``apply_function``.

    ``apply_function`` is a dotted path (triggers are serialized) and runs on the triggerer's event loop, so it
    must be quick. What is stored is read without a consumer; new messages come through the one subscription a
    triggerer process shares for the stream. ``check`` moves ``start_seq`` past what it looked at.
    ``fetch_timeout`` is unused, accepted so that triggers deferred by an earlier release resume.

    Events: ``{"status": "matched", "message", "next_seq", "scanned"}``, ``error`` or ``timeout``. The matched
    message is a reference (:data:`MESSAGE_REFERENCE`), since Airflow's triggerer logs every event: the body,
    headers and the function's result stay out and the sensor reads them back (``body_in_event=True``: all in).
    """

    what = "a message"
    serialized = ("stream", "apply_function", "start_seq", "filter_subject", "apply_function_args",
                  "apply_function_kwargs", "fetch_timeout", "body_in_event")

    def __init__(self, *, stream: str, apply_function: FunctionSpec, start_seq: int, filter_subject: str | None = None,
                 apply_function_args: Sequence[Any] | None = None, apply_function_kwargs: dict[str, Any] | None = None,
                 fetch_timeout: float | str | timedelta | None = None, body_in_event: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.apply_function = apply_function
        self.start_seq = int(start_seq)
        self.filter_subject = filter_subject
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.fetch_timeout = None if fetch_timeout is None else to_seconds(fetch_timeout, field="fetch_timeout")
        self.body_in_event = body_in_event
        self.last_seen = f"no message of stream {stream} from seq {self.start_seq} looked at yet"

    def goal(self) -> str:
        return (f"a message of stream {self.stream} ({self.filter_subject or 'all subjects'}) "
                f"from seq {self.start_seq} "
                f"that satisfies {self.apply_function}")

    async def _find(self, conn: JetStreamConnection, *, follow: bool) -> dict[str, Any]:
        from airflow_jetstream.client.reading.apply_function import bind_function
        from airflow_jetstream.client.reading.read_plan import find_message

        match = bind_function(self.apply_function, self.apply_function_args, self.apply_function_kwargs)
        first = self.start_seq
        found = await find_message(conn, self.stream, match, subject=self.filter_subject, start_seq=first,
                                   follow=follow)
        self.start_seq = found["next_seq"]
        message = found["message"]
        answer = f"match at seq {message['seq']}" if message else "no match yet"
        self.last_seen = f"looked at {found['scanned']} message(s) of stream {self.stream} from seq {first}: {answer}"
        if message and not self.body_in_event:
            found["message"] = {key: message[key] for key in MESSAGE_REFERENCE}
        return found

    async def check(self, conn: JetStreamConnection) -> dict[str, Any] | None:
        found = await self._find(conn, follow=False)
        return {"status": "matched", **found} if found["message"] else None

    async def wait(self, conn: JetStreamConnection) -> dict[str, Any]:
        self.log.info("Waiting for %s", self.goal())
        return {"status": "matched", **await self._find(conn, follow=True)}
