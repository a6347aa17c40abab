"""A stalled server (SIGSTOP, then SIGCONT) must not leave the connection "connected" but dead.

nats-py 2.16 keeps the cancelled future of a timed-out ``flush(timeout=...)`` in its PONG queue; the
late PONG used to end its read loop, so every later request on the connection timed out.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.batches.wire import publish_acked
from airflow_jetstream.client.connection import connect, open_connection
from airflow_jetstream.client.errors import RequestTimeoutError
from airflow_jetstream.client.settings import ConnectionSettings
from tests.support.polling import async_wait_until
from tests.support.stall import resume, stop


def test_a_stalled_server_leaves_a_working_connection_after_it_resumes(nats_server):
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=1)
    pid = nats_server.process.pid

    async def main():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "STALL", "subjects": ["stall.>"]})
            stop(pid)
            try:
                # no acknowledgement, then the permission check's PING times out too: its future is cancelled
                stalled = await publish_acked(conn, [BatchMessage("stall.a", b"1")], 1.0)
            finally:
                resume(pid)
            assert stalled[0].error == "timeout"
            answers = []

            async def answered() -> bool:  # each try waits at most request_timeout (1 s)
                try:
                    answers.append(await conn.api_request("INFO", retry=False))
                except RequestTimeoutError:
                    return False
                return True

            # long enough for nats-py to find a dead read loop's connection stale (2 unanswered PINGs 10 s apart)
            # and reconnect: then the answer comes on a new connection, which the reconnect count shows
            await async_wait_until(answered, "the connection answering again after the server resumed", timeout=60)
            return answers[0], conn.nc.stats["reconnects"], conn.nc._reading_task.done(), conn.nc.is_connected

    info, reconnects, reader_ended, connected = asyncio.run(main())
    assert not reader_ended, "nats-py's read loop ended on the late PONG"
    assert "limits" in info and connected
    assert reconnects == 0, "the answer came only after nats-py found the connection stale and reconnected"


def test_why_the_pong_guard_exists_and_what_it_does():
    """nats-py (2.16) sets the result of the oldest PONG future even when its flush gave up and cancelled it;
    when nats-py stops doing that, this fails and the guard can go (client/natspy_internals.py)."""
    import nats.aio.client

    from airflow_jetstream.client.natspy_internals import install_pong_guard

    async def main() -> tuple[bool, tuple[int, int, bool]]:
        nc = nats.aio.client.Client()
        gave_up, waiting = asyncio.get_running_loop().create_future(), asyncio.get_running_loop().create_future()
        gave_up.cancel()
        nc._pongs = [gave_up, waiting]
        try:
            await nats.aio.client.Client._process_pong(nc)
            natspy_raises = False
        except asyncio.InvalidStateError:
            natspy_raises = True
        nc._pongs, nc._pongs_received, nc._pings_outstanding = [gave_up, waiting], 0, 2
        install_pong_guard(nc)
        await nc._process_pong()  # the late PONG of the flush that gave up: skipped, nothing raised
        await nc._process_pong()  # the next one answers the PING still waited for
        return natspy_raises, (nc._pongs_received, nc._pings_outstanding, waiting.done())

    natspy_raises, guarded = asyncio.run(main())
    assert natspy_raises, "nats-py no longer fails on a cancelled PONG future: remove install_pong_guard"
    assert guarded == (2, 0, True)


def _established_to(port: int) -> int:
    """This host's TCP connections to ``port`` on 127.0.0.1 that are established, from the kernel's table."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for row in rows if row.split()[2] == f"0100007F:{port:04X}" and row.split()[3] == "01")


def test_a_connect_its_caller_gives_up_on_leaves_no_connection(nats_server):
    """A trigger cancelled while it connects to a stalled server: the connect stops with it and closes its socket.
    Before, nats-py's connect went on alone and, once the server answered, held a connection nobody owned."""
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=60, request_timeout=1)
    pid = nats_server.process.pid
    port = int(nats_server.url.rsplit(":", 1)[1])

    async def main() -> int:
        stop(pid)
        try:
            connecting = asyncio.ensure_future(connect(settings))
            # the stopped server's kernel accepts the connection; the client then waits for the server's INFO
            await async_wait_until(lambda: _established_to(port) == 1, "the client's TCP connection")
            connecting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await connecting
            return _established_to(port)
        finally:
            resume(pid)

    assert asyncio.run(main()) == 0, "the cancelled connect still holds its connection"
    assert not [c for c in nats_server.monitor("connz").get("connections") or []
                if c.get("name") == settings.client_name]
