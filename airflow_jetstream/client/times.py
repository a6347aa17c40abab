"""Points in time as users give them (datetime or ISO 8601) and as the server wants them (RFC 3339, UTC), and
the server's clock as a client reads it."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from airflow_jetstream.client.errors import InvalidRequestError, JetStreamError

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection


def parse_time(value: datetime | str, *, field: str = "time") -> datetime:
    """A timezone-aware datetime from a datetime or an ISO 8601 string (naive means UTC)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidRequestError(
                f"{field}: cannot read {value!r} as a time; use ISO 8601 such as '2026-01-31T12:00:00Z'"
            ) from None
    if not isinstance(value, datetime):
        raise InvalidRequestError(f"{field}: expected a datetime or ISO 8601 string, got {type(value).__name__}")
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def to_rfc3339(value: datetime | str) -> str:
    """A timestamp as the server wants it (RFC 3339, UTC). Naive datetimes are taken as UTC."""
    when = parse_time(value)
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


class ServerClock:
    """Seconds since the epoch by the server's clock: the time a stream info answer carries (``ts``, the
    server's clock when it answered) plus what this process's monotonic clock counted since.

    Deadlines decided with it do not depend on the host's wall clock: a host whose clock is skewed or
    stepped reads the server's time all the same (within the request's round trip); a process frozen
    (SIGSTOP, a VM paused) reads the right time when it resumes, since the monotonic clock counts on.
    Until :meth:`sync` it reads the host's clock (what a reader's summary uses).
    """

    def __init__(self) -> None:
        self._base: tuple[float, float] | None = None  # (server epoch seconds, monotonic seconds) at the sync

    async def sync(self, conn: JetStreamConnection, stream: str) -> None:
        """Read the server's time once (a STREAM.INFO of ``stream``); later calls do nothing."""
        if self._base is not None:
            return
        sent = time.monotonic()
        info = await conn.api_request(f"STREAM.INFO.{stream}", context=f"stream {stream!r}")
        answered = time.monotonic()
        if not isinstance(info.get("ts"), str):
            raise JetStreamError(f"stream {stream!r}: the server's answer carries no time ('ts'); the ledger's "
                                 "deadlines use the server's clock: use nats-server 2.10 or later")
        self._base = (parse_time(info["ts"], field="ts").timestamp(), (sent + answered) / 2)

    def __call__(self) -> float:
        if self._base is None:
            return time.time()
        server, at = self._base
        return server + (time.monotonic() - at)
