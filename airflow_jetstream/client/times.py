"""Points in time as users give them (datetime or ISO 8601) and as the server wants them (RFC 3339, UTC)."""

from __future__ import annotations

from datetime import UTC, datetime

from airflow_jetstream.client.errors import InvalidRequestError


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
