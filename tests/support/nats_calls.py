"""Call client coroutines from sync tests on a fresh connection (closed afterwards)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection, stream_info
from airflow_jetstream.client.batches.fence import fence_count
from airflow_jetstream.embedded import EmbeddedNatsServer


def call_on_server(settings: ConnectionSettings, func: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """``await func(conn, *args, **kwargs)`` on a new connection and event loop."""

    async def call() -> Any:
        async with open_connection(settings) as conn:
            return await func(conn, *args, **kwargs)

    return asyncio.run(call())


def call_on(server: EmbeddedNatsServer, func: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """``await func(conn, *args, **kwargs)`` on a new connection to a test's ``server`` (10 s requests)."""
    return call_on_server(ConnectionSettings(servers=server.url, request_timeout=10), func, *args, **kwargs)


def with_streams(settings: ConnectionSettings, body: Callable[[Any], Awaitable[Any]],
                 streams: Iterable[dict[str, Any]]) -> Any:
    """Ensure ``streams`` (configs), then ``await body(conn)``."""

    async def setup_then_body(conn: Any) -> Any:
        for stream in streams:
            await ensure_stream(conn, stream)
        return await body(conn)

    return call_on_server(settings, setup_then_body)


async def stored_rows(conn: Any, stream: str) -> int:
    """Messages in ``stream`` other than the write fences of its atomic batches (one per fenced chunk)."""
    return int((await stream_info(conn, stream))["state"]["messages"]) - await fence_count(conn, stream)
