"""Map an Airflow ``nats`` Connection onto :class:`ConnectionSettings`."""

from __future__ import annotations

from typing import Any

from airflow_jetstream.client.errors import InvalidSettingsError
from airflow_jetstream.client.settings import DEFAULT_PORT, ConnectionSettings, parse_servers

#: Extra fields of the ``nats`` connection (stored in ``extra`` as JSON).
EXTRA_FIELDS = {
    "token": str,
    "nkey_seed": str,
    "creds_file": str,
    "tls_ca_file": str,
    "tls_cert_file": str,
    "tls_key_file": str,
    "tls_verify": bool,
    "tls_hostname": str,
    "connect_timeout": float,
    "request_timeout": float,
    "client_name": str,
    "domain": str,
    "api_prefix": str,
}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _coerce(key: str, value: Any) -> Any:
    kind = EXTRA_FIELDS[key]
    if value is None or value == "":
        return None
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise InvalidSettingsError(f"connection extra {key!r} must be true or false, got {value!r}")
    if kind is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise InvalidSettingsError(f"connection extra {key!r} must be a number of seconds, got {value!r}") from None
    if not isinstance(value, str):
        raise InvalidSettingsError(f"connection extra {key!r} must be a string")
    return value.strip()


def settings_from_connection(conn: Any, **overrides: Any) -> ConnectionSettings:
    """Build settings from an Airflow Connection (``host``, ``port``, ``login``, ``password``, extras).

    ``host`` may list several servers (``n1:4222,n2:4222``) with optional ``nats://``/``tls://``;
    ``port`` applies to entries without one. Unknown extras are refused so typos do not pass silently.
    """
    try:
        extra = conn.extra_dejson
    except Exception:
        raise InvalidSettingsError(f"connection {conn.conn_id!r}: 'extra' is not valid JSON") from None
    if not isinstance(extra, dict):
        raise InvalidSettingsError(f"connection {conn.conn_id!r}: 'extra' must be a JSON object")
    unknown = sorted(k for k in extra if k not in EXTRA_FIELDS)
    if unknown:
        raise InvalidSettingsError(
            f"connection {conn.conn_id!r}: unknown extra field(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(EXTRA_FIELDS))}"
        )
    values = {k: _coerce(k, v) for k, v in extra.items()}
    values = {k: v for k, v in values.items() if v is not None}
    host = conn.host or "127.0.0.1"
    if conn.schema and "://" not in host and conn.schema in ("nats", "tls"):
        host = ",".join(f"{conn.schema}://{h.strip()}" for h in host.split(","))
    try:
        port = int(conn.port) if conn.port else DEFAULT_PORT
    except (TypeError, ValueError):
        raise InvalidSettingsError(f"connection {conn.conn_id!r}: port {conn.port!r} is not a number") from None
    settings = ConnectionSettings(
        servers=parse_servers(host, default_port=port),
        user=conn.login or None,
        password=conn.password or None,
        **values,
    )
    return settings.with_overrides(**overrides) if overrides else settings
