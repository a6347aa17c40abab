"""Reference-counted NATS connections shared by everything on one event loop (the triggerer).

A triggerer runs hundreds of deferred sensors on one event loop. Each opening its own NATS
connection wastes a socket, a reader task and buffers per trigger. Here every user of the same
:class:`ConnectionSettings` on the same loop gets the same :class:`JetStreamConnection`; it is
closed when the last user releases it::

    async with shared_connection(settings) as conn:
        ...  # subscriptions made here must be undone here: the connection outlives this block

Concurrent first users wait on one connect; a failed connect is raised to each of them and
leaves nothing behind; a connection that was closed (e.g. by the server) is replaced on the
next acquire.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from airflow_jetstream.client import metrics
from airflow_jetstream.client.connection import JetStreamConnection, connect
from airflow_jetstream.client.settings import ConnectionSettings


@dataclass
class _Entry:
    ready: asyncio.Task[JetStreamConnection]
    users: int = 0
    closing: bool = False

    def broken(self) -> bool:
        """The connect failed, or the connection has been closed since."""
        if not self.ready.done():
            return False
        return self.ready.cancelled() or self.ready.exception() is not None or self.ready.result().nc.is_closed


class ConnectionPool:
    """Shared connections keyed by (settings, running event loop)."""

    def __init__(self) -> None:
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ConnectionSettings, _Entry]] = (
            weakref.WeakKeyDictionary()
        )

    def _entries(self) -> dict[ConnectionSettings, _Entry]:
        return self._loops.setdefault(asyncio.get_running_loop(), {})

    async def acquire(self, settings: ConnectionSettings) -> JetStreamConnection:
        """The shared connection for ``settings`` on this loop (connecting if needed); +1 user."""
        entries = self._entries()
        entry = entries.get(settings)
        if entry is None or entry.broken():
            entry = entries[settings] = _Entry(ready=asyncio.ensure_future(self._connect(settings)))
        entry.users += 1
        try:
            return await asyncio.shield(entry.ready)
        except BaseException:  # this user gives up its share; the last one leaves nothing behind
            await self.release(settings, entry)
            raise

    @staticmethod
    async def _connect(settings: ConnectionSettings) -> JetStreamConnection:
        conn = await connect(settings)
        metrics.incr("pool.connections_opened")
        return conn

    async def release(self, settings: ConnectionSettings, entry: _Entry | None = None) -> None:
        """-1 user; the last user closes the connection."""
        entries = self._entries()
        entry = entry or entries.get(settings)
        if entry is None:
            return
        entry.users -= 1
        if entry.users > 0:
            return
        if entries.get(settings) is entry:
            del entries[settings]  # before awaiting: a new acquirer builds a fresh connection
        if entry.closing:
            return
        entry.closing = True
        try:
            conn = await entry.ready
        except Exception:  # the connect failed: its acquirers got the error, there is nothing to close
            return
        await conn.close()
        metrics.incr("pool.connections_closed")

    def users(self, settings: ConnectionSettings) -> int:
        """How many users hold the shared connection for ``settings`` on this loop (0 if none)."""
        entry = self._entries().get(settings)
        return entry.users if entry else 0

    def open_connections(self) -> int:
        """How many shared connections exist on the running loop."""
        return len(self._entries())


#: The process-wide pool used by triggers.
POOL = ConnectionPool()


@asynccontextmanager
async def shared_connection(settings: ConnectionSettings,
                            pool: ConnectionPool | None = None) -> AsyncIterator[JetStreamConnection]:
    """``async with shared_connection(settings) as conn``: borrow the loop's shared connection."""
    pool = pool or POOL
    conn = await pool.acquire(settings)
    try:
        yield conn
    finally:
        await pool.release(settings)
