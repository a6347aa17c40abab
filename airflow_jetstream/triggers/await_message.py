"""JetStreamAwaitMessageTrigger: wait in the triggerer for a message that satisfies a function."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import ConsumerNotFoundError
from airflow_jetstream.client.reading.apply_function import bind_function
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.triggers.base import TRANSIENT_ERRORS, retrying
from airflow_jetstream.triggers.deadline import within


class JetStreamAwaitMessageTrigger(BaseTrigger):
    """Fire once a message of ``stream`` (matching ``subject``) from ``start_seq`` on satisfies ``apply_function``.

    ``apply_function`` is a dotted path (triggers are serialized); it runs on the triggerer's event loop,
    so it must be quick and must not block. All triggers of one connection id share one NATS connection
    per triggerer event loop.

    Events: ``{"status": "matched", "message": {...}, "next_seq", "scanned"}`` or
    ``{"status": "error", "error": {...}}`` or, once ``timeout_at`` (ISO time) passed, ``{"status": "timeout"}``.
    """

    def __init__(self, *, stream: str, apply_function: str, start_seq: int, subject: str | None = None,
                 apply_function_args: Sequence[Any] | None = None, apply_function_kwargs: dict[str, Any] | None = None,
                 fetch_timeout: float | str | timedelta | None = None,
                 nats_conn_id: str = JetStreamHook.default_conn_name, timeout_at: str | None = None) -> None:
        super().__init__()
        self.timeout_at = timeout_at
        self.stream = stream
        self.apply_function = apply_function
        self.start_seq = int(start_seq)
        self.subject = subject
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.fetch_timeout = to_seconds(5.0 if fetch_timeout is None else fetch_timeout, field="fetch_timeout")
        self.nats_conn_id = nats_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "stream": self.stream, "apply_function": self.apply_function, "start_seq": self.start_seq,
            "subject": self.subject, "apply_function_args": self.apply_function_args,
            "apply_function_kwargs": self.apply_function_kwargs, "fetch_timeout": self.fetch_timeout,
            "nats_conn_id": self.nats_conn_id, "timeout_at": self.timeout_at,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent(await within(self.timeout_at, self._wait()))

    async def _wait(self) -> dict[str, Any]:
        # a search consumer dropped by the server (e.g. the triggerer stalled past its inactivity limit)
        # is made again: the search restarts at start_seq, so nothing is missed
        return await retrying(self.log, "Message wait", self._search,
                              transient=(*TRANSIENT_ERRORS, ConsumerNotFoundError))

    async def _search(self) -> dict[str, Any]:
        from airflow_jetstream.client.connection_pool import shared_connection
        from airflow_jetstream.client.reading.await_message import find_message

        match = bind_function(self.apply_function, self.apply_function_args, self.apply_function_kwargs)
        settings = await JetStreamHook(nats_conn_id=self.nats_conn_id).aget_settings()
        self.log.info("Waiting for a message of stream %s (%s) from seq %d that satisfies %s", self.stream,
                      self.subject or "all subjects", self.start_seq, self.apply_function)
        async with shared_connection(settings) as conn:
            found = await find_message(conn, self.stream, match, subject=self.subject,
                                       start_seq=self.start_seq, follow=True, poll=self.fetch_timeout)
        return {"status": "matched", **found}
