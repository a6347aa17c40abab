"""JetStreamHook: the ``nats`` Airflow connection turned into NATS JetStream connections.

The connection maps onto :class:`ConnectionSettings` here (parsing lives in client/settings); an unknown id
or a connection of another type is a typed error naming the fix. Importing this module makes Airflow's
``Stats`` the sink of the client's metrics (prefix ``jetstream.``), so every operator, sensor and trigger
reports through the backend configured in ``[metrics]``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.providers.common.compat.sdk import AirflowNotFoundException
from airflow.sdk import BaseHook
from airflow.sdk.observability import stats as airflow_stats

from airflow_jetstream.client import metrics
from airflow_jetstream.client.errors import InvalidSettingsError, JetStreamError
from airflow_jetstream.client.settings import (
    CONNECTION_FIELDS,
    DEFAULT_PORT,
    ConnectionSettings,
    settings_from_fields,
    unknown_fields_error,
)

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

T = TypeVar("T")
PREFIX = "jetstream."
# Airflow 3.3 has module-level functions; Airflow 3.2 (task-sdk 1.2) only the ``Stats`` object.
_STATS = airflow_stats if hasattr(airflow_stats, "incr") else airflow_stats.Stats


class AirflowStatsSink:
    """A :class:`~airflow_jetstream.client.metrics.MetricsSink` writing to Airflow's ``Stats``."""

    def incr(self, name: str, count: int = 1, tags: dict[str, str] | None = None) -> None:
        _STATS.incr(PREFIX + name, count, tags=tags)

    def timing(self, name: str, millis: float, tags: dict[str, str] | None = None) -> None:
        _STATS.timing(PREFIX + name, millis, tags=tags)

    def gauge(self, name: str, value: float, tags: dict[str, str] | None = None) -> None:
        _STATS.gauge(PREFIX + name, value, tags=tags)


def install_airflow_stats() -> None:
    """Make Airflow's ``Stats`` the sink of the client's metrics."""
    metrics.set_metrics_sink(AirflowStatsSink())


install_airflow_stats()


#: The Airflow connection type this provider's hook serves.
CONN_TYPE = "nats"


class ConnectionNotFoundError(InvalidSettingsError, AirflowNotFoundException, reason="connection_not_found"):
    """No Airflow connection has this id (still an ``AirflowNotFoundException`` for Airflow's own handlers)."""


class ConnectionTypeError(InvalidSettingsError, reason="wrong_connection_type"):
    """The connection exists but is of another type than ``nats`` (e.g. ``spark_default``)."""


def settings_from_connection(conn: Any, **overrides: Any) -> ConnectionSettings:
    """Build settings from an Airflow Connection (``host``, ``port``, ``login``, ``password``, extras).

    ``host`` may list several servers (``n1:4222,n2:4222``) with optional ``nats://``/``tls://``;
    ``port`` applies to entries without one. Unknown extras are refused so typos do not pass silently.
    A connection of another type is refused (:class:`ConnectionTypeError`); one without a type (a bare
    ``AIRFLOW_CONN_*`` JSON) is accepted.
    """
    conn_type = getattr(conn, "conn_type", None)
    if conn_type and conn_type != CONN_TYPE:
        raise ConnectionTypeError(
            f"connection {conn.conn_id!r} is of type {conn_type!r}, not {CONN_TYPE!r}: pass nats_conn_id= the id "
            f"of a NATS JetStream connection (type {CONN_TYPE!r}; default 'nats_default'), or, if this connection "
            f"points at a NATS server, change its type to {CONN_TYPE!r}")
    try:
        port = int(conn.port) if conn.port else DEFAULT_PORT
    except (TypeError, ValueError):
        raise InvalidSettingsError(f"connection {conn.conn_id!r}: port {conn.port!r} is not a number") from None
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
    fields = {"servers": host, "user": conn.login or None, "password": conn.password or None, **extra}
    settings = settings_from_fields(fields, default_port=port, what=f"connection {conn.conn_id!r} extra")
    return settings.with_overrides(**overrides) if overrides else settings


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class JetStreamHook(BaseHook):
    """Connects to NATS JetStream using an Airflow connection of type ``nats``.

    Operators use the sync facade :meth:`run` (``hook.run(stream_info, "ORDERS")`` with any client/ coroutine
    function); triggers and async code use ``async with hook.connection() as conn``. ``settings_overrides``
    are ``ConnectionSettings`` fields that win over the connection's.
    """

    conn_name_attr = "nats_conn_id"
    default_conn_name = "nats_default"
    conn_type = CONN_TYPE
    hook_name = "NATS JetStream"

    def __init__(self, nats_conn_id: str = default_conn_name, **settings_overrides: Any) -> None:
        super().__init__()
        self.nats_conn_id = nats_conn_id
        self.settings_overrides = settings_overrides

    def __repr__(self) -> str:
        return f"JetStreamHook(nats_conn_id={self.nats_conn_id!r})"

    @cached_property
    def settings(self) -> ConnectionSettings:
        """Client settings from the connection; secrets are registered with Airflow's masker."""
        return self.get_settings()

    def get_settings(self) -> ConnectionSettings:
        """Client settings from the connection.

        :raises ConnectionNotFoundError: no connection has the id.
        :raises ConnectionTypeError: the connection is not of type ``nats``.
        :raises InvalidSettingsError: its fields are malformed.
        """
        with self._defined():
            return self._masked_settings(self.get_connection(self.nats_conn_id))

    async def aget_settings(self) -> ConnectionSettings:
        """Async variant for triggers: resolves the connection without blocking the event loop."""
        with self._defined():
            return self._masked_settings(await self.aget_connection(self.nats_conn_id))

    @contextmanager
    def _defined(self) -> Iterator[None]:
        """An unknown connection id as :class:`ConnectionNotFoundError`, saying how to define one."""
        try:
            yield
        except AirflowNotFoundException:
            conn_id = self.nats_conn_id
            raise ConnectionNotFoundError(
                f"connection {conn_id!r} is not defined: create a connection of type {CONN_TYPE!r} (NATS JetStream) "
                f"with this id (Admin > Connections, `airflow connections add`, or AIRFLOW_CONN_{conn_id.upper()}), "
                "or pass nats_conn_id= the id of an existing one (docs/connection.md)") from None

    def _masked_settings(self, conn: Any) -> ConnectionSettings:
        from airflow.sdk.log import mask_secret

        settings = settings_from_connection(conn, **self.settings_overrides)
        for secret in settings.secrets():
            mask_secret(secret)
        return settings

    def get_conn(self) -> ConnectionSettings:
        """The resolved client settings (a NATS connection is bound to an event loop, so none is kept)."""
        return self.settings

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[JetStreamConnection]:
        """``async with hook.connection() as conn``: an open connection, closed on exit. Counts connections opened
        and the JetStream errors that leave it, by reason."""
        from airflow_jetstream.client.connection import open_connection  # nats-py: not when a DAG file is parsed

        settings = self.__dict__.get("settings") or await self.aget_settings()
        try:
            async with open_connection(settings) as conn:
                metrics.incr("connection.opened")
                yield conn
        except JetStreamError as exc:
            metrics.incr("error", tags={"reason": exc.reason})
            raise

    def run(self, func: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``await func(conn, *args, **kwargs)`` on a fresh connection and event loop; always closes."""
        self.get_conn()  # resolved here, outside the event loop: connection() then reuses it

        async def call() -> T:
            async with self.connection() as conn:
                return await func(conn, *args, **kwargs)

        if not _loop_running():  # asyncio.run outside any `except`: a real error is not chained to "no loop"
            return asyncio.run(call())
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, call()).result()

    def test_connection(self) -> tuple[bool, str]:
        """Used by the UI's Test button and ``airflow connections test``."""
        from airflow_jetstream.client.connection import account_info

        try:
            info = self.run(account_info)
        except JetStreamError as exc:
            return False, str(exc)
        streams = info.get("streams", 0)
        return True, (
            f"Connected to {', '.join(self.settings.servers)}: JetStream enabled "
            f"(api level {info.get('api', {}).get('level', '?')}, {streams} stream(s))"
        )
