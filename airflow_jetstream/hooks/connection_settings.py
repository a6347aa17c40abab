"""Map an Airflow ``nats`` Connection onto :class:`ConnectionSettings` (parsing lives in client/settings).

A connection id that names no connection, or a connection of another type (``spark_default`` handed to a
``nats`` operator), is a typed error naming the id, the type and the fix, before anything is parsed.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import AirflowNotFoundException

from airflow_jetstream.client.errors import InvalidSettingsError
from airflow_jetstream.client.settings import (
    CONNECTION_FIELDS,
    DEFAULT_PORT,
    ConnectionSettings,
    settings_from_fields,
    unknown_fields_error,
)

#: The Airflow connection type this provider's hook serves.
CONN_TYPE = "nats"
#: Extra fields of the ``nats`` connection (stored in ``extra`` as JSON), with their types.
EXTRA_FIELDS = {name: spec.kind for name, spec in CONNECTION_FIELDS.items()}


class ConnectionNotFoundError(InvalidSettingsError, AirflowNotFoundException):
    """No Airflow connection has this id (still an ``AirflowNotFoundException`` for Airflow's own handlers)."""

    default_reason = "connection_not_found"


class ConnectionTypeError(InvalidSettingsError):
    """The connection exists but is of another type than ``nats`` (e.g. ``spark_default``)."""

    default_reason = "wrong_connection_type"


def connection_not_found(conn_id: str) -> ConnectionNotFoundError:
    """The error for an unknown connection id, saying how to define one."""
    return ConnectionNotFoundError(
        f"connection {conn_id!r} is not defined: create a connection of type {CONN_TYPE!r} (NATS JetStream) with "
        f"this id (Admin > Connections, `airflow connections add`, or AIRFLOW_CONN_{conn_id.upper()}), or pass "
        "nats_conn_id= the id of an existing one (docs/connection.md)")


def check_connection_type(conn: Any) -> None:
    """Refuse a connection of another type; one without a type (a bare ``AIRFLOW_CONN_*`` JSON) is accepted."""
    conn_type = getattr(conn, "conn_type", None)
    if conn_type and conn_type != CONN_TYPE:
        raise ConnectionTypeError(
            f"connection {conn.conn_id!r} is of type {conn_type!r}, not {CONN_TYPE!r}: pass nats_conn_id= the id "
            f"of a NATS JetStream connection (type {CONN_TYPE!r}; default 'nats_default'), or, if this connection "
            f"points at a NATS server, change its type to {CONN_TYPE!r}")


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
        raise unknown_fields_error(unknown, list(CONNECTION_FIELDS), "extra field",
                                   where=f"connection {conn.conn_id!r}: ")
    host = conn.host or "127.0.0.1"
    if conn.schema and "://" not in host and conn.schema in ("nats", "tls"):
        host = ",".join(f"{conn.schema}://{h.strip()}" for h in host.split(","))
    return {"servers": host, "user": conn.login or None, "password": conn.password or None, **extra}


def settings_from_connection(conn: Any, **overrides: Any) -> ConnectionSettings:
    """Build settings from an Airflow Connection (``host``, ``port``, ``login``, ``password``, extras).

    ``host`` may list several servers (``n1:4222,n2:4222``) with optional ``nats://``/``tls://``;
    ``port`` applies to entries without one. Unknown extras are refused so typos do not pass silently.
    A connection of another type is refused (:class:`ConnectionTypeError`).
    """
    check_connection_type(conn)
    try:
        port = int(conn.port) if conn.port else DEFAULT_PORT
    except (TypeError, ValueError):
        raise InvalidSettingsError(f"connection {conn.conn_id!r}: port {conn.port!r} is not a number") from None
    settings = settings_from_fields(connection_fields(conn), default_port=port,
                                    what=f"connection {conn.conn_id!r} extra")
    return settings.with_overrides(**overrides) if overrides else settings
