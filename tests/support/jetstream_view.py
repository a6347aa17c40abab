"""What the JetStream view tests look at: streams, consumers, a source, a ledger run and advisories."""

from __future__ import annotations

import asyncio
import concurrent.futures
from datetime import UTC, datetime, timedelta

from airflow_jetstream.client.admin.consumers import ensure_consumer, pause_consumer
from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.advisories import ensure_capture_stream
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.ledger import BatchLedger
from airflow_jetstream.client.settings import ConnectionSettings

STREAM = "ORDERS"
AGG = "ORDERS_AGG"
MESSAGES = 6
WORKER = "worker"  # 2 delivered, not acked: ack pending 2, pending MESSAGES - 2
PAUSED = "paused_reader"
RUN_ID = "run-2026-11-26"
BATCHES = 3  # batch-0 consumed after 1 attempt, the others published


async def _seed(settings: ConnectionSettings) -> None:
    async with open_connection(settings) as conn:
        await ensure_capture_stream(conn)  # first, so it captures the consumer advisories below
        await ensure_stream(conn, {"name": STREAM, "subjects": ["orders.>"], "allow_atomic": True})
        await ensure_stream(conn, {"name": AGG, "sources": [{"name": STREAM}]})
        for i in range(MESSAGES):
            await conn.js.publish(f"orders.{i % 2}", b'{"n": %d}' % i)
        await ensure_consumer(conn, STREAM, {"name": WORKER, "durable_name": WORKER, "ack_policy": "explicit",
                                             "ack_wait": 3600, "filter_subject": "orders.>"})
        sub = await conn.js.pull_subscribe_bind(WORKER, stream=STREAM)
        delivered = await sub.fetch(2, timeout=5)
        assert len(delivered) == 2
        await sub.unsubscribe()
        await ensure_consumer(conn, STREAM, {"name": PAUSED, "durable_name": PAUSED, "ack_policy": "explicit"})
        await pause_consumer(conn, STREAM, PAUSED, datetime.now(UTC) + timedelta(hours=1))
        ledger = await BatchLedger.open(conn)
        for i in range(BATCHES):
            await ledger.record(RUN_ID, f"batch-{i}", stream=STREAM, count=2, first_seq=2 * i + 1, last_seq=2 * i + 2)
        claim = await ledger.claim(RUN_ID, "batch-0")
        await ledger.mark_consumed(claim)


def seed_view_data(settings: ConnectionSettings) -> None:
    """Seed the server (in a thread of its own: Playwright's sync API keeps an event loop running here)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, _seed(settings)).result()
