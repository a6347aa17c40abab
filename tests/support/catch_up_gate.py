"""A follower of a shared tail run while every turn of the tail's catch-up gate is taken (shared_tail.py).

Each follower reads what was stored before it joined inside ``listener.catching_up()``, so that thousands of
waiters starting together read their backlog ``CATCH_UP_AT_ONCE`` at a time. :func:`held_at_the_gate` takes every
turn through a listener of its own on the same tail, starts the follower, and waits until it either came to the
gate (and queues there) or finished without asking for a turn; only then are the turns given back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Literal, TypeVar

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.reading.shared_tail import CATCH_UP_AT_ONCE, follow
from tests.support.polling import async_wait_until

T = TypeVar("T")


class _WatchedGate(asyncio.Semaphore):
    """The tail's gate, counting the acquires that found every turn taken (the same semaphore otherwise)."""

    def __init__(self) -> None:
        super().__init__(CATCH_UP_AT_ONCE)
        self.queued = 0

    async def acquire(self) -> Literal[True]:
        if self.locked():
            self.queued += 1
        return await super().acquire()


async def held_at_the_gate(conn: JetStreamConnection, stream: str, follower: Awaitable[T], *,
                           tail_filter: str | None = None, timeout: float = 20.0) -> tuple[bool, T]:
    """Run ``follower`` (something that follows ``stream``'s tail with ``tail_filter`` on ``conn``) while every
    catch-up turn is taken; return whether it finished before a turn was free, and its result once one was.

    A follower that catches up inside the gate queues there: the turns are given back once it is queued, and it
    finishes after. One that reads without the gate (or through another tail) finishes while they are held."""
    async with follow(conn, stream, tail_filter=tail_filter) as held:
        gate = held.tail.catch_up_gate = _WatchedGate()
        for _ in range(CATCH_UP_AT_ONCE):
            await gate.acquire()
        waiting = asyncio.ensure_future(follower)
        try:
            await async_wait_until(lambda: waiting.done() or gate.queued, "the follower at the catch-up gate or done",
                                   timeout=timeout)
            finished_while_held = waiting.done()
            for _ in range(CATCH_UP_AT_ONCE):
                gate.release()
            return finished_while_held, await asyncio.wait_for(waiting, timeout)
        finally:  # a follower that never came nor finished is stopped before its tail closes
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
