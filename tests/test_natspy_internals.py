"""Guard: the nats-py private attributes client/natspy_internals.py relies on, and the reasons its JetStream
API calls stay raw. A nats-py upgrade that changes any of them fails here first, naming it."""

from __future__ import annotations

import asyncio
import inspect

import nats.errors
import pytest
from nats.aio.client import Client
from nats.js.manager import JetStreamManager

from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.natspy_internals import CLIENT_ATTRIBUTES, write_raw
from airflow_jetstream.client.reading.headers import Headers
from airflow_jetstream.client.settings import ConnectionSettings


def test_the_private_client_attributes_exist_with_the_shape_used() -> None:
    for name in ("_send_command", "_flush_pending"):
        assert inspect.iscoroutinefunction(getattr(Client, name)), name
    assert isinstance(inspect.getattr_static(Client, "_parse_header_lines"), staticmethod)
    assert list(inspect.signature(Client._parse_header_lines).parameters) == ["raw"]
    assert Client._parse_header_lines(b"A: 1\r\nA: 2\r\n") == {"A": "2"}  # nats-py keeps one value per name
    client = Client()
    for name in CLIENT_ATTRIBUTES:
        assert hasattr(client, name), f"nats-py Client has no {name} any more: update client/natspy_internals.py"
    assert isinstance(client._pending_data_size, int) and isinstance(client._max_pending_size, int)


def test_raw_writes_and_the_installed_header_parser_work_on_a_real_connection(nats_server) -> None:
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=2)

    async def main():
        async with open_connection(settings) as conn:
            sub = await conn.nc.subscribe("guard.a")
            await write_raw(conn.nc, b"HPUB guard.a 36 38\r\nNATS/1.0\r\nX-M: a\r\nX-M: b\r\nX-O: 1\r\n\r\nhi\r\n")
            msg = await sub.next_msg(timeout=3)
            with pytest.raises(nats.errors.NoRespondersError):  # status lines still parsed by nats-py
                await conn.nc.request("nobody.listens", b"", timeout=2)
            await ensure_stream(conn, {"name": "GUARD", "subjects": ["guard.s"]})
            await conn.js.publish("guard.s", b"x")
            purged = await JetStreamManager(conn.nc).purge_stream("GUARD")
            return msg, purged

    msg, purged = asyncio.run(main())
    assert msg.data == b"hi" and isinstance(msg.headers, Headers)
    assert msg.headers == {"X-M": "b", "X-O": "1"} and msg.headers.repeated == {"X-M": ["a", "b"]}
    # Why purges stay raw: nats-py returns only success, not how many messages were purged.
    assert purged is True


def test_why_the_remaining_api_calls_stay_raw() -> None:
    # get_msg cannot ask for the first message at or after a time (consumer reset by time needs it)
    assert "start_time" not in inspect.signature(JetStreamManager.get_msg).parameters
    from nats.js import api

    # consumer info as a dataclass drops fields nats-py does not model: the server's priority-group state
    assert "priority_groups" not in api.ConsumerInfo.__dataclass_fields__
    reply = {"stream_name": "S", "name": "c", "created": "2026-01-01T00:00:00Z",
             "config": {"durable_name": "c", "ack_policy": "explicit"},
             "delivered": {"consumer_seq": 0, "stream_seq": 0}, "ack_floor": {"consumer_seq": 0, "stream_seq": 0},
             "num_ack_pending": 0, "num_redelivered": 0, "num_waiting": 0, "num_pending": 0,
             "priority_groups": [{"group": "jobs", "pinned_client_id": "abc"}]}
    parsed = api.ConsumerInfo.from_response(dict(reply))
    assert parsed.name == "c" and parsed.num_pending == 0
    assert "priority_groups" not in vars(parsed), "nats-py models priority groups now: consider its consumer_info"
