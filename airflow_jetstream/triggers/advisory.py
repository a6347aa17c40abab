"""JetStreamAdvisoryTrigger: wait in the triggerer for a matching advisory (or for a quiet period)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_jetstream.client.advisories.filter import AdvisoryFilter
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.times import parse_time
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.triggers.base import retrying

EXPECT_VALUES = ("present", "absent")


def filter_kwargs(advisory_filter: AdvisoryFilter) -> dict[str, Any]:
    """The filter as the trigger's keyword arguments (``advisory_stream``/``batch_id`` for its ``stream``/``batch``)."""
    data = advisory_filter.to_dict()
    return {"advisory": data["advisory"], "advisory_stream": data["stream"], "consumer": data["consumer"],
            "batch_id": data["batch"], "reason": data["reason"], "match": data["match"]}


class JetStreamAdvisoryTrigger(BaseTrigger):
    """Fire once a matching advisory is found; in guard mode, also fire when ``quiet_until`` passes.

    Reads the capture stream from ``start_time`` (so advisories published before the trigger started
    are found), or subscribes live when ``capture_stream`` is None. All triggers of one connection
    id share one NATS connection per triggerer event loop.

    Events: ``{"status": "matched", "advisory": {...}}``, ``{"status": "quiet", ...}`` (guard mode,
    nothing matched until ``quiet_until``), ``{"status": "timeout", "description": ...}`` (nothing matched
    until ``timeout_at``) or ``{"status": "error", "error": {...}}``. ``report_gap=False`` leaves the
    capture-gap warning to the sensor that already logged it.
    """

    def __init__(
        self,
        *,
        advisory: str | None = None,
        advisory_stream: str | None = None,
        consumer: str | None = None,
        batch_id: str | None = None,
        reason: str | None = None,
        match: dict[str, Any] | str | None = None,
        start_time: str | None = None,
        expect: str = "present",
        capture_stream: str | None = "ADVISORIES",
        quiet_until: str | None = None,
        nats_conn_id: str = JetStreamHook.default_conn_name,
        fetch_timeout: float | str | timedelta | None = None,
        timeout_at: str | None = None,
        report_gap: bool = True,
    ) -> None:
        super().__init__()
        if expect not in EXPECT_VALUES:
            raise ValueError(f"expect must be one of {EXPECT_VALUES}, got {expect!r}")
        if expect == "absent" and not quiet_until:
            raise ValueError("expect='absent' needs quiet_until (when the quiet period ends)")
        self.advisory_filter = AdvisoryFilter(advisory=advisory, stream=advisory_stream,
                                              consumer=consumer, batch=batch_id,
                                              reason=reason, match=match)
        self.start_time = start_time
        self.expect = expect
        self.capture_stream = capture_stream
        self.quiet_until = quiet_until
        self.nats_conn_id = nats_conn_id
        self.fetch_timeout = to_seconds(fetch_timeout or 30.0, field="fetch_timeout")
        self.timeout_at = timeout_at
        self.report_gap = report_gap

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                **filter_kwargs(self.advisory_filter),
                "start_time": self.start_time,
                "expect": self.expect,
                "capture_stream": self.capture_stream,
                "quiet_until": self.quiet_until,
                "nats_conn_id": self.nats_conn_id,
                "fetch_timeout": self.fetch_timeout,
                "timeout_at": self.timeout_at,
                "report_gap": self.report_gap,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent(await retrying(self.log, "Advisory wait", self._connect_and_wait))

    async def _connect_and_wait(self) -> dict[str, Any]:
        from airflow_jetstream.client.connection_pool import shared_connection

        settings = await JetStreamHook(nats_conn_id=self.nats_conn_id).aget_settings()
        async with shared_connection(settings) as conn:
            return await self._wait(conn)

    async def _wait(self, conn: Any) -> dict[str, Any]:
        from airflow_jetstream.client.advisories.capture import watch_advisories

        since = parse_time(self.start_time, field="start_time") if self.start_time else datetime.now(UTC)
        watcher = watch_advisories(conn, self.advisory_filter, capture_stream=self.capture_stream, start_time=since,
                                   fetch_timeout=self.fetch_timeout,
                                   on_gap=self.log.warning if self.report_gap else None)
        self.log.info("Waiting for %s in %s since %s (expect %s)", self.advisory_filter.describe(),
                      self.capture_stream or "live advisories", since.isoformat(), self.expect)
        async with aclosing(watcher):
            if self.expect == "present":
                remaining = None
                if self.timeout_at:
                    remaining = (parse_time(self.timeout_at, field="timeout_at") - datetime.now(UTC)).total_seconds()
                try:
                    async with asyncio.timeout(None if remaining is None else max(remaining, 0.0) + 0.001):
                        advisory = await anext(watcher)
                except TimeoutError:
                    where = f"capture stream {self.capture_stream!r}" if self.capture_stream else "live advisories"
                    return {"status": "timeout", "description": f"no {self.advisory_filter.describe()} in {where} "
                                                                f"since {since.isoformat()}"}
                return {"status": "matched", "advisory": advisory.to_dict()}
            quiet_until = parse_time(str(self.quiet_until), field="quiet_until")
            remaining = (quiet_until - datetime.now(UTC)).total_seconds()
            try:
                async with asyncio.timeout(max(remaining, 0.0) + 0.001):
                    advisory = await anext(watcher)
            except TimeoutError:
                return await self._final_check(conn, since)
            return {"status": "matched", "advisory": advisory.to_dict()}

    async def _final_check(self, conn: Any, since: datetime) -> dict[str, Any]:
        """At the end of the quiet period, scan the whole window once more (nothing stored is skipped)."""
        from airflow_jetstream.client.advisories.capture import find_captured

        checked_until = datetime.now(UTC)
        if self.capture_stream:
            found = await find_captured(conn, self.capture_stream, start_time=since,
                                        advisory_filter=self.advisory_filter)
            if found["advisory"] is not None:
                return {"status": "matched", "advisory": found["advisory"]}
        return {"status": "quiet", "since": since.isoformat(), "checked_until": checked_until.isoformat()}
