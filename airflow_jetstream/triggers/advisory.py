"""JetStreamAdvisoryTrigger: wait in the triggerer for a matching advisory (or for a quiet period)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.advisories.types import AdvisoryFilter
from airflow_jetstream.client.durations import parse_time, to_seconds
from airflow_jetstream.triggers.base import JetStreamWaitTrigger

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

EXPECT_VALUES = ("present", "absent")
#: An advisory filter as the sensor's and triggers' keyword arguments: the :class:`AdvisoryFilter` field of each.
FILTER_ARGS = {"advisory": "advisory", "advisory_stream": "stream", "advisory_consumer": "consumer",
               "batch_id": "batch", "reason": "reason", "match": "match"}


def filter_of(values: Any) -> AdvisoryFilter:
    """The filter of the attributes ``values`` keeps under the keyword arguments' names."""
    return AdvisoryFilter(**{name: getattr(values, arg) for arg, name in FILTER_ARGS.items()})


class JetStreamAdvisoryTrigger(JetStreamWaitTrigger):
    """Fire once a matching advisory is found; in guard mode (``expect="absent"``), also once ``quiet_until`` passes.

    Reads the capture stream from ``start_time`` without a consumer (so earlier advisories are found), then
    what is captured next through the one subscription its triggerer process shares; with
    ``capture_stream=None`` it subscribes live. ``fetch_timeout`` is unused, accepted so that triggers deferred
    by an earlier release resume. Events: ``matched`` (with ``advisory``), ``quiet``, ``timeout`` or ``error``.
    ``report_gap=False`` leaves the capture-gap warning to the sensor that already logged it.
    """

    what = "an advisory"
    serialized = (*FILTER_ARGS, "start_time", "expect", "capture_stream", "quiet_until", "fetch_timeout", "report_gap")

    def __init__(self, *, advisory: str | None = None, advisory_stream: str | None = None,
                 advisory_consumer: str | None = None, batch_id: str | None = None, reason: str | None = None,
                 match: dict[str, Any] | str | None = None, start_time: str | None = None, expect: str = "present",
                 capture_stream: str | None = "ADVISORIES", quiet_until: str | None = None,
                 fetch_timeout: float | str | timedelta | None = None, report_gap: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if expect not in EXPECT_VALUES:
            raise ValueError(f"expect must be one of {EXPECT_VALUES}, got {expect!r}")
        if expect == "absent" and not quiet_until:
            raise ValueError("expect='absent' needs quiet_until (when the quiet period ends)")
        self.advisory = advisory
        self.advisory_stream = advisory_stream
        self.advisory_consumer = advisory_consumer
        self.batch_id = batch_id
        self.reason = reason
        self.match = match
        self.advisory_filter = filter_of(self)
        self.start_time = start_time
        self.expect = expect
        self.capture_stream = capture_stream
        self.quiet_until = quiet_until
        self.fetch_timeout = None if fetch_timeout is None else to_seconds(fetch_timeout, field="fetch_timeout")
        self.report_gap = report_gap
        #: a poke in live mode (no capture stream) listens this many seconds; never serialized
        self.listen_for = 0.0
        #: why advisories since ``start_time`` may be missing from the capture stream (set by ``check``)
        self.gap: str | None = None
        self.last_seen = (f"no {self.advisory_filter.describe()} in {self._where()} since "
                          f"{start_time or 'the trigger started'}")

    def _since(self) -> datetime:
        if not self.start_time:
            self.start_time = datetime.now(UTC).isoformat()  # from the first look on
        return parse_time(self.start_time, field="start_time")

    def _where(self) -> str:
        return f"capture stream {self.capture_stream!r}" if self.capture_stream else "live advisories"

    def goal(self) -> str:
        return f"{self.advisory_filter.describe()} in {self._where()} (expect {self.expect})"

    async def check(self, conn: JetStreamConnection) -> dict[str, Any] | None:
        from airflow_jetstream.client.advisories.capture import find_captured, listen_live

        since, checked_at = self._since(), datetime.now(UTC)
        flt = self.advisory_filter
        if self.capture_stream:
            found = await find_captured(conn, self.capture_stream, start_time=since, advisory_filter=flt)
            self.gap, advisory = found["gap"], found["advisory"]
            self.last_seen = (f"scanned {found['scanned']} captured advisories since {since.isoformat()} for "
                              f"{flt.describe()}: {'match' if advisory else 'no match'}")
        else:
            listened = await listen_live(conn, flt, self.listen_for) if self.listen_for > 0 else None
            advisory = listened.to_dict() if listened else None
            self.last_seen = (f"listened {self.listen_for:g} s to live advisories for {flt.describe()}: "
                              f"{'match' if advisory else 'no match'}")
        if advisory is not None:
            return {"status": "matched", "advisory": advisory}
        if self.expect == "absent" and checked_at >= parse_time(str(self.quiet_until), field="quiet_until"):
            return {"status": "quiet", "since": since.isoformat(), "checked_until": checked_at.isoformat()}
        return None

    async def wait(self, conn: JetStreamConnection) -> dict[str, Any]:
        from airflow_jetstream.client.advisories.capture import watch_advisories

        since = self._since()
        flt = self.advisory_filter
        watcher = watch_advisories(conn, flt, capture_stream=self.capture_stream, start_time=since,
                                   on_gap=self.log.warning if self.report_gap else None)
        self.log.info("Waiting for %s in %s since %s (expect %s)", flt.describe(), self._where(), since.isoformat(),
                      self.expect)
        async with aclosing(watcher):
            if self.expect == "present":
                return {"status": "matched", "advisory": (await anext(watcher)).to_dict()}
            remaining = (parse_time(str(self.quiet_until), field="quiet_until") - datetime.now(UTC)).total_seconds()
            try:
                async with asyncio.timeout(max(remaining, 0.0) + 0.001):
                    return {"status": "matched", "advisory": (await anext(watcher)).to_dict()}
            except TimeoutError:
                pass
        # the quiet period is over: one more look at the whole window (nothing stored is skipped)
        event = await self.check(conn)
        return event or {"status": "quiet", "since": since.isoformat(), "checked_until": datetime.now(UTC).isoformat()}
