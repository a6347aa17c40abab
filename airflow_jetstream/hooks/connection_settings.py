"""Map an Airflow ``nats`` Connection onto :class:`ConnectionSettings` (parsing lives in client/settings)."""

from __future__ import annotations

from typing import Any

from airflow_jetstream.client.errors import InvalidSettingsError
from airflow_jetstream.client.settings import (
    CONNECTION_FIELDS,
    DEFAULT_PORT,
    ConnectionSettings,
    settings_from_fields,
)

#: Extra fields of the ``nats`` connection (stored in ``extra`` as JSON), with their types.
EXTRA_FIELDS = {name: spec.kind for name, spec in CONNECTION_FIELDS.items()}


def connection_fields(conn: Any) -> dict[str, Any]:
    """The connection as :func:`settings_from_fields` input: ``host``/``port``/``schema``/``login`` + extras."""
    try:
        extra = conn.extra_dejson
    except Exception:
        raise InvalidSettingsError(f"connection {conn.conn_id!r}: 'extra' is not valid JSON") from None
    if not isinstance(extra, dict):
        raise InvalidSettingsError(f"connection {conn.conn_id!r}: 'extra' must be a JSON object")
    unknown = sorted(k for k in extra if k not in CONNECTION_FIELDS)
    if unknown:
        raise InvalidSettingsError(
            f"connection {conn.conn_id!r}: unknown extra field(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(CONNECTION_FIELDS))}"
        )
    host = conn.host or "127.0.0.1"
    if conn.schema and "://" not in host and conn.schema in ("nats", "tls"):
        host = ",".join(f"{conn.schema}://{h.strip()}" for h in host.split(","))
    return {"servers": host, "user": conn.login or None, "password": conn.password or None, **extra}


def settings_from_connection(conn: Any, **overrides: Any) -> ConnectionSettings:
    """Build settings from an Airflow Connection (``host``, ``port``, ``login``, ``password``, extras).

    ``host`` may list several servers (``n1:4222,n2:4222``) with optional ``nats://``/``tls://``;
    ``port`` applies to entries without one. Unknown extras are refused so typos do not pass silently.
    """
    try:
        port = int(conn.port) if conn.port else DEFAULT_PORT
    except (TypeError, ValueError):
        raise InvalidSettingsError(f"connection {conn.conn_id!r}: port {conn.port!r} is not a number") from None
    settings = settings_from_fields(connection_fields(conn), default_port=port,
                                    what=f"connection {conn.conn_id!r} extra")
    return settings.with_overrides(**overrides) if overrides else settings
