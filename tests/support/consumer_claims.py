"""The orders pipeline consumer's ledger claims as the multi-host tier watches them (tests/test_hosts_deployment.py):
when ``consume_orders`` holds its run's batches, the claims' deadline passing, and what the records say afterwards.

Read from the controller, which reaches every NATS node whatever host is cut off: the claims and records through the
ledger's public API (a summary is one read of the run's counts), and when each record's last write was stored and
what time it is by the servers' clock from the ledger's KV stream itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.durations import ServerClock
from airflow_jetstream.client.kv.names import stream_of
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.records import BatchRecord
from airflow_jetstream.client.reading.stored import get_message
from tests.support.nats_calls import call_on_server

#: The example pipeline's ledger bucket (dags_examples/orders_pipeline_common.py).
LEDGER_BUCKET = "batch_ledger"


def wait_claims(settings: ConnectionSettings, run_id: str, finished: Callable[[], bool], *,
                timeout: float = 900) -> dict[str, Any] | None:
    """Wait until a consume attempt holds claims on the run's batches (``in_progress`` in the ledger's counts) and
    return the run's summary then; None when ``finished()`` (checked about once a second) says the run ended first.
    Polls every 0.1 s on one connection: a consume job holds its claims for seconds."""
    async def go() -> dict[str, Any] | None:
        async with open_connection(settings) as conn:
            ledger = BatchLedger(conn, LEDGER_BUCKET)
            deadline = time.monotonic() + timeout
            polls = 0
            while time.monotonic() < deadline:
                summary = await ledger.summary(run_id)
                if summary["states"].get("in_progress"):
                    return summary
                polls += 1
                if polls % 10 == 0 and finished():
                    return None
                await asyncio.sleep(0.1)
        raise AssertionError(f"no consume attempt of {run_id} claimed its batches within {timeout} s")

    return asyncio.run(go())


def batch_records(settings: ConnectionSettings, run_id: str) -> list[BatchRecord]:
    """Every batch record of the run (a listing)."""
    records: list[BatchRecord] = call_on_server(settings, lambda conn: BatchLedger(conn, LEDGER_BUCKET).batches(run_id))
    return records


async def _server_now(conn: Any) -> float:
    clock = ServerClock()
    await clock.sync(conn, stream_of(LEDGER_BUCKET))
    return clock()


def server_now(settings: ConnectionSettings) -> float:
    """The servers' clock now, in seconds since the epoch (what the ledger's stream info says)."""
    now: float = call_on_server(settings, _server_now)
    return now


async def _stored_times(conn: Any, records: list[BatchRecord]) -> list[float]:
    times = []
    for rec in records:
        message = await get_message(conn, stream_of(LEDGER_BUCKET), seq=rec.revision)
        assert message is not None and message.time is not None, rec
        times.append(message.time.timestamp())
    return times


def stored_times(settings: ConnectionSettings, records: list[BatchRecord]) -> list[float]:
    """When the stream stored each record's last write, in seconds since the epoch: the time the write was
    accepted, by the server's clock. A record's own times (``consumed_at``) are its writer's reading of a clock
    when it decided to write, which can be long before the write lands (a writer cut off retries it)."""
    times: list[float] = call_on_server(settings, _stored_times, records)
    return times
