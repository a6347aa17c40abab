"""streams_for_subject is nats-py's find_stream_name_by_subject with the toolkit's typed errors."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.manager import JetStreamManager

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.admin.streams import streams_for_subject
from airflow_jetstream.client.errors import JetStreamNotEnabledError, PermissionDeniedError


def test_the_lookup_is_nats_py_s(nats_server, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    find = JetStreamManager.find_stream_name_by_subject

    async def recording(self, subject: str) -> str:
        asked.append(subject)
        return await find(self, subject)

    monkeypatch.setattr(JetStreamManager, "find_stream_name_by_subject", recording)
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=2)

    async def main() -> tuple[list[str], list[str]]:
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "LOOKUP", "subjects": ["lookup.>"]})
            return await streams_for_subject(conn, "lookup.a"), await streams_for_subject(conn, "nowhere.a")

    assert asyncio.run(main()) == (["LOOKUP"], [])
    assert asked == ["lookup.a", "nowhere.a"]


def test_its_errors_are_typed(nats_server_factory) -> None:
    user = {"user": "app", "password": "app-pw",
            "permissions": {"publish": {"deny": ["$JS.API.STREAM.NAMES"]}}}
    server = nats_server_factory(config={"authorization": {"users": [user]}})
    denied = ConnectionSettings(servers=server.url, user="app", password="app-pw", connect_timeout=2,
                                request_timeout=1)
    no_js = ConnectionSettings(servers=server.url, user="app", password="app-pw", connect_timeout=2,
                               request_timeout=1, api_prefix="$NOJS.API")

    async def lookup(settings: ConnectionSettings) -> BaseException:
        async with open_connection(settings) as conn:
            with pytest.raises((PermissionDeniedError, JetStreamNotEnabledError)) as info:
                await streams_for_subject(conn, "orders.a")
            return info.value

    assert isinstance(asyncio.run(lookup(denied)), PermissionDeniedError)
    assert isinstance(asyncio.run(lookup(no_js)), JetStreamNotEnabledError)
