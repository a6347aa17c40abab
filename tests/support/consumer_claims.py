"""The orders pipeline consumer's ledger claims as the multi-host tier watches them (tests/test_hosts_deployment.py):
when ``consume_orders`` holds its run's batches, the claims' deadline passing, and what the records say afterwards.

Read through the ledger's public API (a summary is one read of the run's counts), from the controller, which reaches
every NATS node whatever host is cut off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.durations import ServerClock
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.ledger.records import BatchRecord
from airflow_jetstream.client.reading.stored import get_message

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
    async def go() -> list[BatchRecord]:
        async with open_connection(settings) as conn:
            return await BatchLedger(conn, LEDGER_BUCKET).batches(run_id)

    return asyncio.run(go())


def server_now(settings: ConnectionSettings) -> float:
    """The servers' clock now, in seconds since the epoch (what the ledger's stream info says)."""
    async def go() -> float:
        async with open_connection(settings) as conn:
            clock = ServerClock()
            await clock.sync(conn, f"KV_{LEDGER_BUCKET}")
            return clock()

    return asyncio.run(go())


def stored_times(settings: ConnectionSettings, records: list[BatchRecord]) -> list[float]:
    """When the stream stored each record's last write, in seconds since the epoch: the time the write was
    accepted, by the server's clock. A record's own times (``consumed_at``) are its writer's reading of that clock
    when it decided to write, which can be long before the write lands (a writer cut off retries it)."""
    async def go() -> list[float]:
        async with open_connection(settings) as conn:
            times = []
            for rec in records:
                message = await get_message(conn, f"KV_{LEDGER_BUCKET}", seq=rec.revision)
                assert message is not None and message.time is not None, rec
                times.append(message.time.timestamp())
            return times

    return asyncio.run(go())
