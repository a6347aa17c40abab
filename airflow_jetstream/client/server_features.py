"""What the connected nats-server supports, learned from the version in its INFO.

Callers ask by feature (``require(conn, ATOMIC_BATCH)``), never by version: the version each feature
needs lives here once. A server too old for a feature is refused *before* anything is sent, with a
:class:`ServerFeatureError` (reason ``server_too_old``) naming the feature and the version it needs.
A stream config field the server does not know is refused the same way; an old server that drops
unknown fields silently (2.11 and before) is caught by comparing the config it echoes back.

In a cluster the version is the one of the server this connection talks to; keep all nodes on one release.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from airflow_jetstream.client.errors import ServerFeatureError


@dataclass(frozen=True)
class Feature:
    """A server capability and the first nats-server release that has it."""

    name: str
    since: tuple[int, int, int]

    @property
    def since_text(self) -> str:
        return ".".join(map(str, self.since))


ATOMIC_BATCH = Feature("atomic batch publish (stream allow_atomic)", (2, 12, 0))
FAST_BATCH = Feature("fast batch publish (stream allow_batched)", (2, 14, 0))
CONSUMER_RESET = Feature("consumer reset", (2, 14, 0))
DURABLE_SOURCING = Feature("durable sourcing (server- or user-managed consumer, sources[].consumer)", (2, 14, 0))
MESSAGE_TTL = Feature("per-message TTL (stream allow_msg_ttl)", (2, 11, 0))
#: Reads without a consumer (client/reading/stored.py): one message per direct get (stream allow_direct), batches
#: of messages per direct get request, and a message get from a time (``start_time``).
DIRECT_GET = Feature("direct get (stream allow_direct)", (2, 9, 0))
DIRECT_GET_BATCH = Feature("batched direct get (batch, next_by_subj, start_time)", (2, 11, 0))
MSG_GET_START_TIME = Feature("message get from a time (start_time)", (2, 11, 0))

# Stream config fields newer than 2.10 -> the release that knows them (checked on the servers of the
# compatibility matrix: 2.11 drops unknown fields silently, 2.12+ refuses them with 10025).
STREAM_FIELDS: dict[str, Feature] = {
    "allow_atomic": ATOMIC_BATCH,
    "allow_batched": FAST_BATCH,
    "allow_msg_ttl": MESSAGE_TTL,
    "subject_delete_marker_ttl": Feature("subject delete markers (subject_delete_marker_ttl)", (2, 11, 0)),
    "allow_msg_counter": Feature("message counters (stream allow_msg_counter)", (2, 12, 0)),
    "allow_msg_schedules": Feature("message schedules (stream allow_msg_schedules)", (2, 12, 0)),
    "persist_mode": Feature("asynchronous persistence (stream persist_mode)", (2, 12, 0)),
}

# Fields a 2.12+ server refuses with 10025 ``unknown field "<name>"`` when it is older than they need.
NEWER_FIELDS: dict[str, Feature] = {**STREAM_FIELDS, "consumer": DURABLE_SOURCING}

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")
_UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``"2.12.8"`` (or ``"v2.12.8-beta"``) as ``(2, 12, 8)``; None when it is not a version."""
    match = _VERSION.match(text.strip()) if isinstance(text, str) else None
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def server_version(conn: Any) -> tuple[int, int, int] | None:
    """The version the connected server announced in its INFO; None when unknown (not connected)."""
    announced = conn.nc.connected_server_version
    try:
        version = (announced.major, announced.minor, announced.patch)
    except ValueError:
        return None
    return None if version == (0, 0, 0) else version


def supports(conn: Any, feature: Feature) -> bool:
    """Whether the connected server has ``feature`` (True when the version is unknown: the server decides)."""
    version = server_version(conn)
    return version is None or version >= feature.since


def require(conn: Any, feature: Feature, *, what: str = "") -> None:
    """Raise :class:`ServerFeatureError` when the connected server is older than ``feature`` needs."""
    if supports(conn, feature):
        return
    version = ".".join(map(str, server_version(conn) or ()))
    raise ServerFeatureError(
        f"{what or feature.name} needs nats-server {feature.since_text} or newer; the connected server is "
        f"{version}. Upgrade the server (all cluster nodes) or use a feature it has",
        reason="server_too_old",
    )


def check_stream_config(conn: Any, config: dict[str, Any]) -> None:
    """Refuse, before sending, stream config fields the connected server does not know."""
    for field, feature in STREAM_FIELDS.items():
        if field in config:
            require(conn, feature, what=f"stream {config.get('name')!r}: field {field!r} ({feature.name})")
    if any(isinstance(s, dict) and "consumer" in s for s in config.get("sources") or []):
        require(conn, DURABLE_SOURCING, what=f"stream {config.get('name')!r}: {DURABLE_SOURCING.name}")


def unknown_field_refusal(conn: Any, error: dict[str, Any], context: str) -> ServerFeatureError | None:
    """A server's 10025 ``unknown field`` answer for a field newer servers know, as the error naming the
    release it needs (None for any other error: a misspelt field stays the server's own message)."""
    match = _UNKNOWN_FIELD.search(str(error.get("description", "")))
    field = match[1] if match and error.get("err_code") == 10025 else None
    feature = NEWER_FIELDS.get(field) if field else None
    if feature is None:
        return None
    version = ".".join(map(str, server_version(conn) or ())) or "unknown"
    return ServerFeatureError(
        f"{context}: nats-server {version} does not know the field {field!r}; {feature.name} needs "
        f"nats-server {feature.since_text} or newer",
        reason="server_too_old", code=error.get("code"), err_code=10025, description=error.get("description"),
    )


def dropped_fields(requested: dict[str, Any], echoed: dict[str, Any]) -> list[str]:
    """Fields asked for (with a set value) that the server left out of the config it answered with."""
    return sorted(k for k, v in requested.items() if v not in (None, False, "", [], {}) and k not in echoed)


def unknown_fields_error(conn: Any, name: str, fields: list[str]) -> ServerFeatureError:
    """The error for a server that ignored ``fields`` of stream ``name``'s config."""
    needs = sorted({STREAM_FIELDS[f].since_text for f in fields if f in STREAM_FIELDS})
    version = ".".join(map(str, server_version(conn) or ())) or "unknown"
    hint = f"they need nats-server {' / '.join(needs)} or newer" if needs else "check their spelling"
    return ServerFeatureError(
        f"stream {name!r}: nats-server {version} does not know the config field(s) {', '.join(fields)} and "
        f"ignored them; {hint}",
        reason="server_too_old" if needs else "unknown_field",
    )
