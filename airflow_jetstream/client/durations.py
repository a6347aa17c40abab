"""Durations as JetStream wants them (nanoseconds), from seconds, strings or timedeltas."""

from __future__ import annotations

import re
from datetime import timedelta

from airflow_jetstream.client.errors import InvalidRequestError

_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
          "h": 3_600_000_000_000, "d": 86_400_000_000_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h|d)")


def to_nanos(value: int | float | str | timedelta, *, field: str = "duration") -> int:
    """Nanoseconds from an int (already ns, as in the server's JSON), a timedelta or '90s'/'1h30m'/'7d'."""
    if isinstance(value, bool):
        raise InvalidRequestError(f"{field}: expected a duration, got {value!r}")
    if isinstance(value, timedelta):
        return int(value.total_seconds() * 1_000_000_000)
    if isinstance(value, (int, float)):
        if value < 0:
            raise InvalidRequestError(f"{field}: a duration cannot be negative ({value})")
        return int(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text.isdigit():
            return int(text)
        pos, total = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos == len(text) and text:
            return int(total)
    raise InvalidRequestError(
        f"{field}: cannot read duration {value!r}; use nanoseconds, a timedelta or a string like '90s', '2h', '7d'"
    )
