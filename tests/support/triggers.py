"""Run a deferrable trigger the way the triggerer does: iterate ``run()`` until its first event."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


def first_event_payload(trigger: Any, *, while_waiting: Callable[[asyncio.Future], Awaitable[None]] | None = None,
                        timeout: float = 20.0) -> dict:
    """The payload of the trigger's first event; ``while_waiting(future)`` runs while it waits."""

    async def scenario() -> dict:
        events = trigger.run()
        first = asyncio.ensure_future(anext(events))
        if while_waiting is not None:
            await while_waiting(first)
        event = await asyncio.wait_for(first, timeout)
        await events.aclose()
        return event.payload

    return asyncio.run(scenario())
