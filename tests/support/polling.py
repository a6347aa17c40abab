"""Polls with a deadline: how tests wait for the server's state (never a bare sleep)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, limit: float = 60.0) -> T:
    """Poll ``predicate`` every 0.2 s until it returns something truthy, and return that; fail naming ``what``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {limit}s waiting for {what}")


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.05) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


async def async_wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.05) -> None:
    """Async variant; ``check()`` may return a value or an awaitable."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(every)
