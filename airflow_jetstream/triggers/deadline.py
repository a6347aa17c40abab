"""A trigger's own deadline: where Airflow does not enforce a deferral timeout, the trigger does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any


async def within(timeout_at: str | None, waiting: Awaitable[dict[str, Any]],
                 timed_out: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """``await waiting``, or ``timed_out()`` (default ``{"status": "timeout"}``) once ``timeout_at`` (ISO time)
    has passed.

    ``airflow dags test`` runs a deferred task's trigger inline and ignores the deferral timeout, so a
    sensor whose condition never came true waited forever; with this it ends at its ``timeout``.
    """
    if timeout_at is None:
        return await waiting
    remaining = (datetime.fromisoformat(timeout_at) - datetime.now(UTC)).total_seconds()
    try:
        return await asyncio.wait_for(waiting, max(remaining, 0.0))
    except TimeoutError:
        return timed_out() if timed_out is not None else {"status": "timeout"}
