"""What the JetStream view tests look at: healthy streams, consumers, a source, a ledger run, and trouble made on
purpose (what an on-call engineer meets): an abandoned batch, a message given up after its last delivery, a
consumer with redeliveries and overdue acknowledgements, one nobody pulls, a paused one, sources that are
broken, inactive or stalled, a ledger run with a failed and an overdue batch, and enough streams that the
aggregate stream is past the first page.

The server must abandon atomic batches quickly: start it with ``jetstream=`` :data:`SERVER_JETSTREAM`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_jetstream.client.admin.consumers import ensure_consumer, pause_consumer
from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.advisories import ensure_capture_stream
from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.ledger import BatchLedger
from airflow_jetstream.client.settings import ConnectionSettings
from tests.support.polling import async_wait_until

#: The nats-server's jetstream block: an open atomic batch is abandoned after 1 s without traffic.
SERVER_JETSTREAM = {"limits": {"batch": {"timeout": "1s"}}}

STREAM = "ORDERS"
AGG = "ORDERS_AGG"
MESSAGES = 6
WORKER = "worker"  # 2 delivered, not acked: ack pending 2, pending MESSAGES - 2
PAUSED = "paused_reader"
RUN_ID = "manual__2026-11-26T10:00:00+00:00"  # an Airflow run id: what the example producer records
BATCHES = 3  # batch-0 consumed after 1 attempt, the others published

#: Streams named to sort before ORDERS_AGG, so that it is past the first page of the streams table (50 rows).
FILLER_STREAMS = 60
#: The trouble.
TROUBLE = "TROUBLE"
ABANDONED_BATCH = "run-42-batch-7"
SLOW = "slow_worker"  # ack_wait 1 s, never acks: redelivered and overdue acknowledgements
SLOW_MESSAGES, SLOW_FETCHED = 2000, 100
POISON = "poison_worker"  # max_deliver 1: gives up a message
IDLE = "idle_reader"  # pending, nobody pulls
BROKEN_AGG = "BROKEN_AGG"  # sources TROUBLE through a consumer that does not exist: inactive
STALLED_ORIGIN, STALLED_AGG, STALLED_CONSUMER = "STALLED_ORIGIN", "STALLED_AGG", "stalled_src"
TROUBLE_RUN = "scheduled__2026-11-26T11:00:00+00:00"
FAILED_BATCH, OVERDUE_BATCH = "batch-failed", "batch-stuck"


#: Airflow's SimpleAuthManager (users log in with JWTs it signs) and short thresholds: trouble is a problem at once.
AIRFLOW_ENV = {
    "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
    "AIRFLOW__API_AUTH__JWT_SECRET": "jetstream-view-tests-" + "0" * 64,
    "AIRFLOW__JETSTREAM__VIEW_CACHE_SECONDS": "0",
    "AIRFLOW__JETSTREAM__PROBLEM_PENDING_IDLE": "1s",
    "AIRFLOW__JETSTREAM__PROBLEM_SOURCE_STALLED": "1s",
    "AIRFLOW_CONN_SPARK_THERE": json.dumps({"conn_type": "spark", "host": "local[2]"}),
}


@contextlib.contextmanager
def mounted_view(connections: dict[str, str]) -> Iterator[FastAPI]:
    """The view mounted under ``/jetstream`` as the api-server does, behind Airflow's auth manager and the tables its
    JWT check, connection listing and event watchers read; ``connections`` are ``AIRFLOW_CONN_*`` values by id."""
    import pytest

    from airflow_jetstream.ui import app as view_app

    with pytest.MonkeyPatch.context() as mp:
        for name, value in AIRFLOW_ENV.items():
            mp.setenv(name, value)
        for conn_id, value in connections.items():
            mp.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", value)
        from airflow import settings
        from airflow.api_fastapi.app import init_auth_manager
        from airflow.models.asset import AssetModel, AssetWatcherModel
        from airflow.models.base import Base
        from airflow.models.connection import Connection
        from airflow.models.revoked_token import RevokedToken
        from airflow.models.trigger import Trigger

        team = next(iter(Trigger.__table__.foreign_keys)).column.table  # the trigger table refers to it
        Base.metadata.create_all(settings.engine, tables=[RevokedToken.__table__, Connection.__table__, team,
                                                          Trigger.__table__, AssetModel.__table__,
                                                          AssetWatcherModel.__table__])
        parent = FastAPI()
        init_auth_manager(parent)
        parent.mount("/jetstream", view_app.app)
        yield parent


def login_token(role: str) -> str:
    """A JWT of a user with ``role`` (``VIEWER``, ``USER``, ``OP``, ``ADMIN``), as Airflow's UI holds in ``_token``."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=role.lower(), role=role))


def client(app: FastAPI, role: str | None) -> TestClient:
    """A client of ``app`` logged in with ``role`` (None: no login) that does not follow redirects."""
    logged_in = TestClient(app, follow_redirects=False)
    if role:
        logged_in.cookies.set("_token", login_token(role))
    return logged_in


async def _seed(conn: JetStreamConnection) -> None:
    await ensure_capture_stream(conn)  # first, so it captures the advisories below
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
    assert claim is not None
    await ledger.mark_consumed(claim)


def seed_view_data(settings: ConnectionSettings) -> None:
    """Seed the server (in a thread of its own: Playwright's sync API keeps an event loop running here)."""
    _in_thread(_seed, settings)


def seed_trouble(settings: ConnectionSettings) -> None:
    """Make the trouble (after :func:`seed_view_data`, on a server started with :data:`SERVER_JETSTREAM`)."""
    _in_thread(_trouble, settings)


def _in_thread(seed, settings: ConnectionSettings) -> None:
    async def run() -> None:
        async with open_connection(settings) as conn:
            await seed(conn)

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, run()).result()


async def _trouble(conn: JetStreamConnection) -> None:
    for i in range(FILLER_STREAMS):
        await ensure_stream(conn, {"name": f"FILLER_{i:02d}", "subjects": [f"filler.{i}"]})
    await ensure_stream(conn, {"name": TROUBLE, "subjects": ["trouble.>"], "allow_atomic": True})
    await _abandoned_batch(conn)
    await _slow_and_poison_consumers(conn)
    await _broken_sources(conn)
    await _ledger_trouble(conn)


async def _abandoned_batch(conn: JetStreamConnection) -> None:
    """An atomic batch opened and never committed: the server abandons it after its 1 s timeout."""
    await conn.nc.request("trouble.batch", b"x", headers={"Nats-Batch-Id": ABANDONED_BATCH, "Nats-Batch-Sequence": "1"})

    async def captured() -> bool:
        info = await conn.api_request("STREAM.INFO.ADVISORIES", {"subjects_filter": "$JS.EVENT.ADVISORY.STREAM.>"})
        subjects = (info["state"].get("subjects") or {})
        return f"$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.{TROUBLE}" in subjects

    await async_wait_until(captured, "the batch_abandoned advisory in the capture stream")


async def _slow_and_poison_consumers(conn: JetStreamConnection) -> None:
    acks = [conn.js.publish("trouble.order", b'{"order": %d}' % i) for i in range(SLOW_MESSAGES)]
    await asyncio.gather(*acks)
    await ensure_consumer(conn, TROUBLE, {"name": SLOW, "durable_name": SLOW, "ack_policy": "explicit",
                                          "ack_wait": 1, "filter_subject": "trouble.order"})
    await ensure_consumer(conn, TROUBLE, {"name": POISON, "durable_name": POISON, "ack_policy": "explicit",
                                          "ack_wait": 1, "max_deliver": 1, "filter_subject": "trouble.order"})
    await ensure_consumer(conn, TROUBLE, {"name": IDLE, "durable_name": IDLE, "ack_policy": "explicit",
                                          "filter_subject": "trouble.order"})
    slow = await conn.js.pull_subscribe_bind(SLOW, stream=TROUBLE)
    poison = await conn.js.pull_subscribe_bind(POISON, stream=TROUBLE)
    await slow.fetch(SLOW_FETCHED, timeout=5)  # never acknowledged
    await poison.fetch(1, timeout=5)

    async def redelivered() -> bool:
        """Pull again after ack_wait: half of the unacknowledged messages come back (redelivered)."""
        info = await conn.api_request(f"CONSUMER.INFO.{TROUBLE}.{SLOW}")
        if info["num_redelivered"] >= SLOW_FETCHED // 2:
            return True
        with contextlib.suppress(TimeoutError):
            await slow.fetch(SLOW_FETCHED // 2, timeout=1)
        return False

    await async_wait_until(redelivered, "redeliveries on the slow consumer", timeout=60)
    await slow.unsubscribe()

    async def given_up() -> bool:
        info = await conn.api_request("STREAM.INFO.ADVISORIES", {"subjects_filter": "$JS.EVENT.ADVISORY.CONSUMER.>"})
        if f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{TROUBLE}.{POISON}" in (info["state"].get("subjects") or {}):
            return True
        with contextlib.suppress(TimeoutError):
            await poison.fetch(1, timeout=1)  # a pull after ack_wait is when the server gives the message up
        return False

    await async_wait_until(given_up, "the max_deliveries advisory of the poison consumer", timeout=60)
    await poison.unsubscribe()


async def _broken_sources(conn: JetStreamConnection) -> None:
    """A source through a consumer that does not exist (inactive), and a user-managed source whose consumer is
    paused while the origin keeps receiving (its backlog cannot shrink)."""
    await conn.api_request(f"STREAM.CREATE.{BROKEN_AGG}", {
        "name": BROKEN_AGG, "subjects": [], "storage": "file",
        "sources": [{"name": TROUBLE, "consumer": {"name": "no_such_consumer", "deliver_subject": "deliver.broken"}}]})
    await ensure_stream(conn, {"name": STALLED_ORIGIN, "subjects": ["stalled.>"], "retention": "workqueue"})
    await conn.api_request(f"CONSUMER.CREATE.{STALLED_ORIGIN}.{STALLED_CONSUMER}", {
        "stream_name": STALLED_ORIGIN, "action": "create", "config": {
            "name": STALLED_CONSUMER, "durable_name": STALLED_CONSUMER, "deliver_subject": "deliver.stalled",
            "ack_policy": "flow_control", "flow_control": True, "idle_heartbeat": 1_000_000_000, "max_deliver": -1,
            "max_ack_pending": 1000}})
    await conn.api_request(f"STREAM.CREATE.{STALLED_AGG}", {
        "name": STALLED_AGG, "subjects": [], "storage": "file",
        "sources": [{"name": STALLED_ORIGIN, "consumer": {"name": STALLED_CONSUMER,
                                                          "deliver_subject": "deliver.stalled"}}]})
    await pause_consumer(conn, STALLED_ORIGIN, STALLED_CONSUMER, datetime.now(UTC) + timedelta(hours=1))
    for i in range(10):
        await conn.js.publish(f"stalled.{i}", b"x")

    async def stalled_source_running() -> bool:  # -1 until the paused consumer's first heartbeat reaches it
        [source] = (await conn.js.stream_info(STALLED_AGG)).sources or []
        return source.active is not None and source.active >= 0

    await async_wait_until(stalled_source_running, "the stalled source to run (active, not inactive)")


async def _ledger_trouble(conn: JetStreamConnection) -> None:
    """A run with one batch failed after its last attempt and one claimed by a worker that died an hour ago."""
    ledger = await BatchLedger.open(conn, max_attempts=1)
    for batch in (FAILED_BATCH, OVERDUE_BATCH, "batch-ok"):
        await ledger.record(TROUBLE_RUN, batch, stream=TROUBLE, count=10, first_seq=1, last_seq=10)
    claim = await ledger.claim(TROUBLE_RUN, FAILED_BATCH, owner="spark-task-3")
    assert claim is not None
    await ledger.release(claim, error="ValueError: bad row 17")
    an_hour_ago = await BatchLedger.open(conn, visibility_timeout="10m", clock=lambda: time.time() - 3600)
    stuck = await an_hour_ago.claim(TROUBLE_RUN, OVERDUE_BATCH, owner="spark-task-4")
    assert stuck is not None
