"""KV calls (KV keys, the batch ledger, job records) refused by the server's permissions fail at once with
``permission_denied`` naming the refused subject, like every other JetStream API call (not after a timeout)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import PermissionDeniedError
from airflow_jetstream.client.kv import ensure_bucket, get_key
from airflow_jetstream.client.kv.job_records import put_job_record
from airflow_jetstream.client.kv.keys import put_key
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.support.nats_calls import request_endings

DENIED = ["$KV.Secrets.>", "$JS.API.STREAM.INFO.KV_Locked", "$KV.ledger_ro.>", "$KV.jobs_ro.>"]


@pytest.fixture(scope="module")
def restricted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectionSettings]:
    """A server with an admin and a user denied publishing to ``DENIED``; the buckets exist."""
    users = [{"user": "admin", "password": "pw-admin-123"},
             {"user": "app", "password": "pw-app-123", "permissions": {"publish": {"deny": DENIED}}}]
    with EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("kvperm"),
                            config={"authorization": {"users": users}}) as server:
        yield from _with_buckets(server)


def _with_buckets(server: EmbeddedNatsServer) -> Iterator[ConnectionSettings]:
    async def setup() -> None:
        admin = ConnectionSettings(servers=server.url, user="admin", password="pw-admin-123", connect_timeout=2)
        async with open_connection(admin) as conn:
            for bucket in ("Secrets", "Locked", "jobs_ro"):
                await ensure_bucket(conn, bucket)
            await BatchLedger.open(conn, "ledger_ro")

    asyncio.run(setup())
    yield ConnectionSettings(servers=server.url, user="app", password="pw-app-123", connect_timeout=2,
                             request_timeout=20, leader_wait=60)


def refused(settings: ConnectionSettings,
            call: Callable[[Any], Awaitable[Any]]) -> tuple[PermissionDeniedError, list[tuple[str, str]]]:
    """The error ``call`` raised, and how each request it sent ended (:func:`request_endings`)."""
    async def main() -> tuple[PermissionDeniedError, list[tuple[str, str]]]:
        async with open_connection(settings) as conn:
            with request_endings(conn) as ended, pytest.raises(PermissionDeniedError) as caught:
                await call(conn)
            return caught.value, ended

    return asyncio.run(main())


@pytest.mark.parametrize(("name", "call", "subject"), [
    ("put", lambda conn: put_key(conn, "Secrets", "k1", "v"), "$KV.Secrets.k1"),
    ("open", lambda conn: get_key(conn, "Locked", "k1"), "$JS.API.STREAM.INFO.KV_Locked"),
    ("ledger", lambda conn: _record(conn), "$KV.ledger_ro.run-1.b-1"),
    ("job record", lambda conn: put_job_record(conn, "job-1", {"state": "committed"}, bucket="jobs_ro"),
     "$KV.jobs_ro.job-1"),
])
def test_kv_calls_fail_fast_naming_the_refused_subject(restricted: ConnectionSettings, name: str,
                                                         call: Callable[[Any], Awaitable[Any]], subject: str) -> None:
    err, ended = refused(restricted, call)
    assert (err.reason, err.subject) == ("permission_denied", subject), name
    assert subject in str(err) and "pw-app-123" not in str(err)
    # the refused request was sent once and ended by the refusal (cancelled), not by its 20 s timeout; the
    # requests before it (stream info) were answered: nothing was retried or waited out
    assert [how for _, how in ended] == ["answered"] * (len(ended) - 1) + ["cancelled"], (name, ended)


async def _record(conn: Any) -> None:
    ledger = await BatchLedger.open(conn, "ledger_ro", create=False)
    await ledger.record("run-1", "b-1", stream="S", count=1, last_seq=1)
