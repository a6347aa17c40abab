"""The chaos checker's read-back against a real nats-server: a read the server cuts short is redone whole.

Right after a heal, a new consumer's pull requests can find no responders (503) for a moment; the
read-back then redoes the read with a fresh consumer instead of ending the run without results.
"""

from __future__ import annotations

import asyncio
import json

import nats
import pytest
from nats.js.client import JetStreamContext

from airflow_jetstream.client import ConnectionSettings, open_connection
from airflow_jetstream.client.ledger import BatchLedger, batch_key
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.chaos import checker
from tests.chaos.history import History
from tests.chaos.nemesis import Nemesis
from tests.chaos.workloads import LEDGER_BUCKET, ZOMBIE


async def _fill(url: str, keys_per_stream: int, *, ledger: bool = True) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for stream in checker.READ_STREAMS:
            await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
            for n in range(keys_per_stream):
                await js.publish(f"{stream.lower()}.x", json.dumps({"k": f"{stream}-{n}"}).encode())
        if ledger:
            kv = await js.create_key_value(bucket=LEDGER_BUCKET)
            await kv.put("b1", json.dumps({"batch_id": "b1", "state": "committed"}).encode())
    finally:
        await nc.close()


def test_read_back_redoes_a_read_whose_consumer_vanished(nats_server: EmbeddedNatsServer,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(_fill(nats_server.url, 300))
    fetch = JetStreamContext.PullSubscription.fetch
    vanished: list[str] = []

    async def fetch_after_the_consumer_vanished(self, *args, **kwargs):
        if not vanished:  # the first pull request of the run finds its consumer gone: a real 503
            info = await self.consumer_info()
            await self._js.delete_consumer(info.stream_name, info.name)
            vanished.append(info.stream_name)
        return await fetch(self, *args, **kwargs)

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", fetch_after_the_consumer_vanished)
    stored, records = asyncio.run(checker.read_back([nats_server.url]))

    assert vanished == [checker.READ_STREAMS[0]]
    for stream in checker.READ_STREAMS:
        places = [stored.of(f"{stream}-{n}") for n in range(300)]
        assert places == [[(stream, n + 1)] for n in range(300)], stream
    assert records == {"b1": {"batch_id": "b1", "state": "committed"}}
    assert f"reading stream {checker.READ_STREAMS[0]} back: " in capsys.readouterr().out  # 503, or 409 if deleted late


def test_read_back_gives_up_after_its_attempts(nats_server: EmbeddedNatsServer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(_fill(nats_server.url, 1))
    fetch = JetStreamContext.PullSubscription.fetch

    async def fetch_without_consumer(self, *args, **kwargs):
        info = await self.consumer_info()
        await self._js.delete_consumer(info.stream_name, info.name)
        return await fetch(self, *args, **kwargs)

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", fetch_without_consumer)
    monkeypatch.setattr(checker, "READ_PAUSE", 0.0)
    with pytest.raises(nats.js.errors.APIError):
        asyncio.run(checker.read_back([nats_server.url]))


async def _ledger_with_a_v1_write(url: str) -> None:
    """Two batches recorded by the ledger (records and counts), one claimed and consumed; then a record written
    the version-1 way (the record alone), which the counts do not know."""
    async with open_connection(ConnectionSettings(servers=url, connect_timeout=2)) as conn:
        ledger = await BatchLedger.open(conn, LEDGER_BUCKET)
        for batch in ("b1", "b2"):
            await ledger.record("run-1", batch, stream="DATA", count=3)
        await ledger.mark_consumed(await ledger.claim("run-1", "b1"))
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(LEDGER_BUCKET)
        record = json.loads((await kv.get(batch_key("run-1", "b2"))).value)
        await kv.put(batch_key("run-1", "b3"), json.dumps({**record, "batch_id": "b3"}).encode())
    finally:
        await nc.close()


def test_ledger_counts_are_checked_against_the_records(nats_server: EmbeddedNatsServer) -> None:
    asyncio.run(_fill(nats_server.url, 1, ledger=False))
    asyncio.run(_ledger_with_a_v1_write(nats_server.url))
    _, records = asyncio.run(checker.read_back([nats_server.url]))

    assert sorted(b for b in records if b != checker.COUNTS) == ["b1", "b2", "b3"]
    report = checker.Report()
    checker._check_ledger_counts(records, report)
    assert report.misreported == 1
    assert report.details == ["misreported: ledger counts of run run-1 say {'consumed': 1, 'published': 1}, "
                              "its records {'consumed': 1, 'published': 2}"]

    del records["b3"]  # the records the ledger wrote itself agree with its counts
    report = checker.Report()
    checker._check_ledger_counts(records, report)
    assert report.misreported == 0


def test_a_zombie_writers_job_is_counted_by_row_id() -> None:
    """Every row of a job a zombie writer and its replacement wrote is stored once: a row twice is ``duplicated``
    (the replacement re-stored what the frozen writer committed), a row missing from a job reported done is
    ``lost`` and ``misreported``."""
    history = History()
    job = history.begin("zombie-writer", 4)
    job.succeed(count=4)
    stored = checker.Stored()
    for seq, key in enumerate([*job.keys[:3], job.keys[0]], start=1):  # row 0 twice, row 3 never
        stored.places[key].append((ZOMBIE, seq))
    report = checker.check(history, stored, {}, Nemesis(cluster=None, topology=None, streams=[]), leader_wait=30)
    assert (report.duplicated, report.lost, report.misreported) == (1, 1, 1), report.details
