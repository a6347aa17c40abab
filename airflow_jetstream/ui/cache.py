"""Reads shared by concurrent page loads, kept a few seconds, and a bound on reads per connection.

During an incident many people open the same page at once. :class:`ReadCache` gives every request
with the same :class:`~airflow_jetstream.ui.snapshot.ReadKey` the same read: the one in flight, or the
finished one while it is younger than ``cache_seconds``. Reads of one connection with different keys
(another ledger bucket, an older ledger page) run at most ``concurrent_reads`` at once; a read waiting
for its turn counts against its deadline. A request that gives up waiting leaves the read running for
the others (it ends by its own deadline). Everything runs on the api-server's event loop: no thread is
held while NATS answers, so a stalled NATS ties up no worker thread.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from airflow_jetstream.ui.problems import Observations
from airflow_jetstream.ui.snapshot import ReadKey

#: Finished reads kept (the least recently used beyond this are dropped).
MAX_ENTRIES = 256

Reader = Callable[[float, Observations], Awaitable[dict[str, Any]]]


@dataclass
class _Entry:
    task: asyncio.Task[dict[str, Any]]
    finished: float | None = None


def _finished(entry: _Entry, loop: asyncio.AbstractEventLoop, _: object) -> None:
    entry.finished = loop.time()


@dataclass
class ReadCache:
    """Single-flight reads with a short time to live, per event loop."""

    entries: OrderedDict[ReadKey, _Entry] = field(default_factory=OrderedDict)
    gates: dict[str, asyncio.Semaphore] = field(default_factory=dict)
    observations: dict[str, Observations] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None
    #: Reads started (not answered from the cache); tests and the performance page count them.
    reads_started: int = 0

    def _for_this_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # tasks and semaphores belong to one loop (a test client may bring another)
            self.entries.clear()
            self.gates.clear()
            self.loop = loop
        return loop

    def _fresh(self, key: ReadKey, ttl: float, now: float) -> _Entry | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        if entry.finished is None or now - entry.finished < ttl:
            self.entries.move_to_end(key)
            return entry
        return None

    async def get(self, key: ReadKey, read: Reader, *, ttl: float, concurrent: int,
                  timeout: float) -> tuple[dict[str, Any], float]:
        """The result of ``read(deadline, observations)`` for ``key`` and its age in seconds (0 for a new read).

        Raises what the read raised (a cached failure too, while fresh); TimeoutError when nothing came within
        ``timeout`` seconds (the read goes on for the others).
        """
        loop = self._for_this_loop()
        entry = self._fresh(key, ttl, loop.time())
        if entry is None:
            gate = self.gates.setdefault(key.connection_id, asyncio.Semaphore(concurrent))
            seen = self.observations.setdefault(key.connection_id, Observations())
            entry = _Entry(loop.create_task(self._run(gate, read, seen, loop.time() + timeout)))
            self.entries[key] = entry
            self.reads_started += 1
            entry.task.add_done_callback(partial(_finished, entry, loop))
            while len(self.entries) > MAX_ENTRIES:
                self.entries.popitem(last=False)
        async with asyncio.timeout(timeout):
            result = await asyncio.shield(entry.task)
        age = loop.time() - entry.finished if entry.finished is not None else 0.0
        return result, age

    @staticmethod
    async def _run(gate: asyncio.Semaphore, read: Reader, seen: Observations, deadline: float) -> dict[str, Any]:
        async with asyncio.timeout_at(deadline):
            await gate.acquire()
        try:
            if asyncio.get_running_loop().time() >= deadline:  # its turn came with its time up: no read at all
                raise TimeoutError
            return await read(deadline, seen)
        finally:
            gate.release()
