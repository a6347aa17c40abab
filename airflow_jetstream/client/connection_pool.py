"""Reference-counted sharing: NATS connections shared by everything on one event loop (the triggerer), and the
one mechanism under it (:class:`Shared`), which also shares each stream's tail on a connection (reading/shared_tail).

A triggerer runs hundreds of deferred sensors on one event loop. Each opening its own NATS
connection wastes a socket, a reader task and buffers per trigger. Here every user of the same
:class:`ConnectionSettings` on the same loop gets the same :class:`JetStreamConnection`; it is
closed when the last user releases it::

    async with shared_connection(settings) as conn:
        ...  # subscriptions made here must be undone here: the connection outlives this block

Concurrent first users wait on one connect; a failed connect is raised to each of them and
leaves nothing behind; a connection that was closed (e.g. by the server) is replaced on the
next acquire, while the users of the closed one still give back that one, not its replacement.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from airflow_jetstream.client import metrics
from airflow_jetstream.client.connection import JetStreamConnection, connect
from airflow_jetstream.client.settings import ConnectionSettings

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class _Entry(Generic[K, V]):
    entries: dict[K, _Entry[K, V]]  # its owner's entries
    key: K
    ready: asyncio.Future[V]
    users: int = 0

    def started(self) -> bool:
        return self.ready.done() and not self.ready.cancelled() and self.ready.exception() is None


class Shared(Generic[K, V]):
    """Values shared by the users of one key within one owner (by default the running event loop; a connection for
    the tails), by reference count.

    The first user of a key starts its value (``start(owner, key)``); users who come while it starts wait for the
    same start, and a failed start is raised to each of them and leaves nothing behind. The last user to release a
    value stops it (``stop``), or cancels its start. A value that ``gone`` says is dead (a connection the server
    closed, a tail that failed) is replaced on the next acquire, while its own users still release that one.
    """

    def __init__(self, start: Callable[[Any, K], Awaitable[V]], stop: Callable[[V], Awaitable[None]],
                 gone: Callable[[V], bool]) -> None:
        self._start, self._stop, self._gone = start, stop, gone
        self._owners: weakref.WeakKeyDictionary[Any, dict[K, _Entry[K, V]]] = weakref.WeakKeyDictionary()
        self._held: dict[int, _Entry[K, V]] = {}  # id(value) -> its entry, while it has users

    def entries(self, owner: Any = None) -> dict[K, _Entry[K, V]]:
        return self._owners.setdefault(asyncio.get_running_loop() if owner is None else owner, {})

    def values(self, owner: Any = None) -> list[V]:
        """The started values of ``owner`` (of every owner when None)."""
        owners = [self.entries(owner)] if owner is not None else list(self._owners.values())
        return [entry.ready.result() for entries in owners for entry in entries.values() if entry.started()]

    async def acquire(self, key: K, owner: Any = None) -> V:
        """The value shared under ``key`` (started if there is none, or the one there is gone); +1 user."""
        owner = asyncio.get_running_loop() if owner is None else owner
        entries = self.entries(owner)
        entry = entries.get(key)
        if entry is None or (entry.ready.done() and (not entry.started() or self._gone(entry.ready.result()))):
            entry = entries[key] = _Entry(entries, key, asyncio.ensure_future(self._start(owner, key)))
        entry.users += 1
        try:
            value = await asyncio.shield(entry.ready)
        except BaseException:  # this user gives up its share; the last one leaves nothing behind
            await self._leave(entry)
            raise
        self._held[id(value)] = entry
        return value

    async def release(self, value: V) -> None:
        """-1 user of ``value``; its last user stops it."""
        await self._leave(self._held[id(value)])

    async def _leave(self, entry: _Entry[K, V]) -> None:
        entry.users -= 1
        if entry.users > 0:
            return
        if entry.entries.get(entry.key) is entry:
            del entry.entries[entry.key]  # before awaiting: a new user starts a new one
        if not entry.ready.done():
            entry.ready.cancel()
            await asyncio.gather(entry.ready, return_exceptions=True)
        elif entry.started():
            self._held.pop(id(entry.ready.result()), None)
            await self._stop(entry.ready.result())

    @asynccontextmanager
    async def use(self, key: K, owner: Any = None) -> AsyncIterator[V]:
        """``async with shared.use(key) as value``: :meth:`acquire`, then :meth:`release`."""
        value = await self.acquire(key, owner)
        try:
            yield value
        finally:
            await self.release(value)


async def _connect(loop: asyncio.AbstractEventLoop, settings: ConnectionSettings) -> JetStreamConnection:
    conn = await connect(settings)
    metrics.incr("pool.connections_opened")
    return conn


async def _close(conn: JetStreamConnection) -> None:
    await conn.close()
    metrics.incr("pool.connections_closed")


class ConnectionPool(Shared[ConnectionSettings, JetStreamConnection]):
    """Shared connections keyed by (settings, running event loop)."""

    def __init__(self) -> None:
        super().__init__(_connect, _close, lambda conn: conn.nc.is_closed)

    def users(self, settings: ConnectionSettings) -> int:
        """How many users hold the shared connection for ``settings`` on this loop (0 if none)."""
        entry = self.entries().get(settings)
        return entry.users if entry else 0

    def open_connections(self) -> int:
        """How many shared connections exist on the running loop."""
        return len(self.entries())


#: The process-wide pool used by triggers.
POOL = ConnectionPool()


@asynccontextmanager
async def shared_connection(settings: ConnectionSettings,
                            pool: ConnectionPool | None = None) -> AsyncIterator[JetStreamConnection]:
    """``async with shared_connection(settings) as conn``: borrow the loop's shared connection."""
    async with (pool or POOL).use(settings) as conn:
        yield conn
