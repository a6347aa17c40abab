"""Guard: the nats-py private attributes client/natspy_internals.py relies on, and the reasons its JetStream
API calls stay raw. A nats-py upgrade that changes any of them fails here first, naming it; at run time the
same probes refuse the first connection with NatsPyVersionError (the tests below change nats-py the way a
release could and watch the connection refuse)."""

from __future__ import annotations

import asyncio
import inspect
from importlib import metadata

import nats.errors
import pytest
from nats.aio.client import Client
from nats.js.manager import JetStreamManager

import airflow_jetstream.client.natspy_internals as natspy_internals
from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import NatsPyVersionError
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
    assert isinstance(client.pending_data_size, int)  # public since 2.15: the reconnect check reads it


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


def test_the_installed_natspy_passes_every_probe() -> None:
    async def main() -> list[str | None]:
        return [await probe() for _use, probe in natspy_internals.PROBES]

    assert asyncio.run(main()) == [None] * len(natspy_internals.PROBES)


def _headers_parsed_elsewhere(self, headers):  # a nats-py that stopped using _parse_header_lines
    async def parse():
        return {"X-Own": "parser"}

    return parse()


async def _pong_renamed(self, data=b""):  # a parser that answers PONG with another method
    if b"PONG" in data:
        await self.nc._handle_pong()


def _no_server_info(monkeypatch) -> None:
    """A nats-py that keeps the server's INFO elsewhere: ``_server_info`` stays an empty dict."""
    monkeypatch.setattr(Client, "_server_info", property(lambda self: {}, lambda self, value: None), raising=False)


CHANGES = {
    "_send_command gone": (lambda mp: mp.delattr(Client, "_send_command"),
                           "raw batch writes (_send_command, _flush_pending): Client._send_command is gone"),
    "_flush_pending takes no kick": (lambda mp: mp.setattr(Client, "_flush_pending", lambda self: None),
                                     "Client._flush_pending is no longer a coroutine function"),
    "headers parsed elsewhere": (lambda mp: mp.setattr(Client, "_process_headers", _headers_parsed_elsewhere),
                                 "repeated header names (_parse_header_lines): Client._process_headers does not "
                                 "parse header lines with the connection's _parse_header_lines"),
    "PONG answered elsewhere": (lambda mp: mp.setattr(natspy_internals.Parser, "parse", _pong_renamed),
                                "the late-PONG guard (_process_pong, _pongs): nats-py's protocol parser no longer "
                                "answers a PONG with the connection's _process_pong"),
    "_pongs renamed": (lambda mp: mp.setattr(Client, "__init__", _renaming_init(Client.__init__, "_pongs")),
                       "Client's PONG bookkeeping changed"),
    "INFO kept elsewhere": (_no_server_info, "cluster detection (_server_info)"),
}


def _renaming_init(init, name):
    def changed(self, *args, **kwargs):
        init(self, *args, **kwargs)
        setattr(self, f"{name}_queue", self.__dict__.pop(name))

    return changed


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_natspy_is_refused_at_connect_naming_its_version_and_the_change(
        change: str, nats_server, monkeypatch) -> None:
    make_change, named = CHANGES[change]
    monkeypatch.setattr(natspy_internals, "_checked", [])  # probe this process's nats-py again
    make_change(monkeypatch)
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=2)

    async def main() -> None:
        async with open_connection(settings):
            pass

    with pytest.raises(NatsPyVersionError) as refused:
        asyncio.run(main())
    assert refused.value.reason == "natspy_incompatible"
    message = str(refused.value)
    assert f"nats-py {metadata.version('nats-py')} changed what airflow-jetstream relies on" in message
    assert named in message, message
    assert 'pip install "nats-py>=2.15.0,<2.17"' in message
    # refused again on the next connection, not once and then silently run
    with pytest.raises(NatsPyVersionError):
        asyncio.run(main())
