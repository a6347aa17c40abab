"""A permission violation explains the one failure it answers: once reported, a later timeout on the same
subject of the same (pooled, long-lived) connection is a timeout again, not "permission denied"."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest

from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import PermissionDeniedError, RequestTimeoutError
from airflow_jetstream.client.settings import ConnectionSettings

USER = {"user": "app", "password": "app-pw"}


async def _reload(server, config: dict) -> None:
    """Rewrite the server's config and reload it (SIGHUP); returns once the server says it loaded it."""
    before = server.monitor("varz")["config_load_time"]
    server.config = config
    server.write_config()
    server.process.send_signal(signal.SIGHUP)
    for _ in range(200):  # bounded: the reload takes milliseconds
        if server.monitor("varz")["config_load_time"] != before:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("nats-server did not reload its config")


def denied_server(nats_server_factory, request_timeout: float = 2) -> tuple[Any, ConnectionSettings]:
    """A server on which ``USER`` may not publish to ``orders.>``, and settings to reach it as that user."""
    denied = {"authorization": {"users": [{**USER, "permissions": {"publish": {"deny": ["orders.>"]}}}]}}
    server = nats_server_factory(config=denied)
    return server, ConnectionSettings(servers=server.url, user=USER["user"], password=USER["password"],
                                      connect_timeout=2, request_timeout=request_timeout)


def test_a_timeout_after_permissions_were_granted_is_a_timeout(nats_server_factory) -> None:
    server, settings = denied_server(nats_server_factory)

    async def main() -> tuple[BaseException, BaseException]:
        async with open_connection(settings) as conn:
            with pytest.raises(PermissionDeniedError) as first:
                await conn.request("orders.a", b"", timeout=5)
            await _reload(server, {"authorization": {"users": [USER]}})  # the operator grants it
            await conn.nc.subscribe("orders.a")  # a responder that never answers
            await conn.nc.flush()
            with pytest.raises(RequestTimeoutError) as later:
                await conn.request("orders.a", b"", timeout=0.5)
            return first.value, later.value

    first, later = asyncio.run(main())
    assert "may not publish to 'orders.a'" in str(first)
    assert not isinstance(later, PermissionDeniedError), later
    assert "no reply to 'orders.a'" in str(later)


def test_reported_violations_are_not_kept_forever(nats_server_factory) -> None:
    _server, settings = denied_server(nats_server_factory)

    async def main() -> int:
        async with open_connection(settings) as conn:
            for index in range(3):
                with pytest.raises(PermissionDeniedError):
                    await conn.request(f"orders.{index}", b"", timeout=5)
            return len(conn.permission_violations)

    assert asyncio.run(main()) == 0


@pytest.mark.timeout(120)
def test_a_refused_request_fails_at_the_refusal_not_at_its_timeout(nats_server_factory) -> None:
    """The request's own timeout is an hour: only the refusal the server reports at once can end it within the
    test's timeout (without the fast path it would end only after the hour, and pytest's timeout fails the test)."""
    _server, settings = denied_server(nats_server_factory, request_timeout=3600)

    async def main() -> PermissionDeniedError:
        async with open_connection(settings) as conn:
            with pytest.raises(PermissionDeniedError) as refused:
                await conn.request("orders.a", b"")
            return refused.value

    assert "may not publish to 'orders.a'" in str(asyncio.run(main()))
