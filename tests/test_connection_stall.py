"""A stalled server (SIGSTOP, then SIGCONT) must not leave the connection "connected" but dead.

nats-py 2.16 keeps the cancelled future of a timed-out ``flush(timeout=...)`` in its PONG queue; the
late PONG used to end its read loop, so every later request on the connection timed out.
"""

from __future__ import annotations

import asyncio
import os
import signal

from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.batches.batcher import publish_individually
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import RequestTimeoutError
from airflow_jetstream.client.settings import ConnectionSettings


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def resume(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


def test_a_stalled_server_leaves_a_working_connection_after_it_resumes(nats_server):
    settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=1)
    pid = nats_server.process.pid

    async def main():
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "STALL", "subjects": ["stall.>"]})
            stop(pid)
            try:
                # no acknowledgement, then the permission check's PING times out too: its future is cancelled
                stalled = await publish_individually(conn, [BatchMessage("stall.a", b"1")], 1.0)
            finally:
                resume(pid)
            assert stalled[0].error == "timeout"
            loop = asyncio.get_running_loop()
            resumed = loop.time()
            for _ in range(20):  # bounded: 20 tries of at most 1 s each
                try:
                    info = await conn.api_request("INFO", retry=False)
                    break
                except RequestTimeoutError:
                    continue
            else:
                info = None
            return info, loop.time() - resumed, conn.nc._reading_task.done(), conn.nc.is_connected

    info, took, reader_ended, connected = asyncio.run(main())
    assert not reader_ended, "nats-py's read loop ended on the late PONG"
    assert info is not None and "limits" in info, "the connection never answered again"
    assert took < 20 and connected
