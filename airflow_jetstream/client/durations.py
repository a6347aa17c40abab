"""One rule for durations: Python takes seconds, a timedelta or '90s'/'1h30m'/'7d'; the server gets nanoseconds.
And points in time as users give them (datetime or ISO 8601) and as the server wants them (RFC 3339, UTC), and the
server's clock as a client reads it.

Every duration a user passes (operator, sensor and trigger arguments, Spark options, client
functions, and the duration fields of stream/consumer config dicts such as ``max_age`` or
``ack_wait``) is read by :func:`to_seconds` / :func:`to_nanos`: an int or float is **seconds**, as in
Airflow, nats-py's ``StreamConfig`` and the Kafka provider; a string of digits (a Spark option) is
seconds too. Nanoseconds appear only inside the JSON sent to the server, which holds them in a
signed 64-bit integer: a longer duration is refused.
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from airflow_jetstream.client.errors import InvalidRequestError, JetStreamError

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

_NANOS_PER_SECOND = 1_000_000_000
_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": _NANOS_PER_SECOND, "m": 60 * _NANOS_PER_SECOND,
          "h": 3_600 * _NANOS_PER_SECOND, "d": 86_400 * _NANOS_PER_SECOND}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h|d)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
#: The longest duration the server stores (nanoseconds in an int64, about 292 years).
MAX_NANOS = 2**63 - 1


class Nanos(int):
    """A duration already converted to nanoseconds: :func:`to_nanos` passes it through unchanged, so a
    config normalized once (operator, then client) is not converted twice. JSON encodes it as an int."""

    __slots__ = ()


def to_nanos(value: int | float | str | timedelta, *, field: str = "duration") -> Nanos:
    """Nanoseconds (for server JSON) from seconds (int/float), a timedelta or a string like '90s', '2h', '7d'."""
    if isinstance(value, Nanos):
        return value
    nanos = _nanos(value, field)
    if nanos < 0:
        raise InvalidRequestError(f"{field}: a duration cannot be negative ({value!r})", reason="invalid_duration")
    if nanos > MAX_NANOS:
        raise InvalidRequestError(f"{field}: {value!r} is longer than the server can store (about 292 years); "
                                  "durations are seconds, a timedelta or a string like '90s'",
                                  reason="invalid_duration")
    return Nanos(nanos)


def _nanos(value: int | float | str | timedelta, field: str) -> int:
    if isinstance(value, bool):
        raise InvalidRequestError(f"{field}: expected a duration, got {value!r}", reason="invalid_duration")
    if isinstance(value, timedelta):
        return (value.days * 86_400 + value.seconds) * _NANOS_PER_SECOND + value.microseconds * 1_000
    if isinstance(value, int):
        return value * _NANOS_PER_SECOND
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequestError(f"{field}: {value!r} is not a duration", reason="invalid_duration")
        return round(value * _NANOS_PER_SECOND)
    if isinstance(value, str):
        text = value.strip().lower()
        if _NUMBER.fullmatch(text):  # a string of digits (a Spark option) is seconds
            text += "s"
        pos, total = 0, 0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            number, unit = match.group(1), _UNITS[match.group(2)]
            total += round(float(number) * unit) if "." in number else int(number) * unit
            pos = match.end()
        if pos == len(text) and text:
            return total
    raise InvalidRequestError(
        f"{field}: cannot read duration {value!r}; use seconds (a number), a timedelta or a string like "
        "'500ms', '90s', '2h', '7d'",
        reason="invalid_duration",
    )


def to_seconds(value: int | float | str | timedelta, *, field: str = "duration") -> float:
    """Seconds from seconds (int/float), a timedelta or a string like '90s', '2h', '7d' (the same rule).

    Durations already in nanoseconds (:class:`Nanos`) are converted back."""
    return to_nanos(value, field=field) / _NANOS_PER_SECOND


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
