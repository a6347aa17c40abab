"""Faults beyond a crash on a 3-node cluster: a stalled server (SIGSTOP/SIGCONT) under the client.

The module shares one cluster; a test that stops a node resumes it and waits until the cluster is healthy.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream, stream_info
from airflow_jetstream.client.advisories.capture import ensure_capture_stream
from airflow_jetstream.client.batches import wire
from airflow_jetstream.client.batches.atomic import publish_atomic_batch
from airflow_jetstream.client.batches.batcher import Batcher
from airflow_jetstream.client.batches.types import BatchMessage
from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.errors import JetStreamError, LeaderUnavailableError, PlacementError
from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.client.natspy_internals import write_raw
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.client.sourcing.provision import provision_durable_source
from airflow_jetstream.client.sourcing.spec import DurableSource
from airflow_jetstream.embedded import EmbeddedNatsCluster
from tests.support.polling import async_wait_until
from tests.support.stall import resume, stop


def connected_node(cluster: EmbeddedNatsCluster, conn: JetStreamConnection) -> str:
    port = conn.nc.connected_url.port
    return next(node.name for node in cluster.nodes if node.url.endswith(f":{port}"))


def batch(tag: str, n: int = 3) -> list[BatchMessage]:
    return [BatchMessage("stall.x", b"%s-%d" % (tag.encode(), i), msg_id=f"{tag}-{i}") for i in range(n)]


def test_a_stall_of_the_connected_server_leaves_the_connection_working(
        nats_cluster_module: EmbeddedNatsCluster) -> None:
    """An atomic batch meets a stall of the connected node; once it resumes the same connection works
    again (before the fix nats-py's read loop had ended on a late PONG: every call timed out until nats-py found
    the connection stale, 2 unanswered PINGs 10 s apart, and reconnected)."""
    cluster = nats_cluster_module
    settings = ConnectionSettings(servers=cluster.servers, connect_timeout=2, request_timeout=2, leader_wait=4)

    async def main() -> tuple[BaseException, int]:
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "STALL", "subjects": ["stall.>"], "num_replicas": 3,
                                       "allow_atomic": True})
            await publish_atomic_batch(conn, batch("before"))
            pid = cluster.node(connected_node(cluster, conn)).process.pid
            stop(pid)
            try:
                during = await asyncio.gather(publish_atomic_batch(conn, batch("during")), return_exceptions=True)
            finally:
                resume(pid)
            after = None
            # bounded: each try waits at most leader_wait plus a request timeout; 8 tries outlast nats-py's
            # reconnect to a connection whose read loop died, which the reconnect count below then shows
            for attempt in range(8):
                try:
                    after = await publish_atomic_batch(conn, batch(f"after{attempt}"))
                    break
                except JetStreamError as exc:
                    during.append(exc)
            assert after is not None, f"the connection never worked again: {during}"
            return during[0], conn.nc.stats["reconnects"]

    try:
        during, reconnects = asyncio.run(main())
    finally:
        cluster.wait_healthy()
    # the stalled node answers nothing: the batch was re-sent for leader_wait, then ended in the one documented error
    assert isinstance(during, LeaderUnavailableError), during
    assert "re-sending it with the same msg ids is safe" in str(during)
    # the same connection, not a reconnect after nats-py found it stale (its read loop used to end on a late PONG)
    assert reconnects == 0, f"the connection worked again only after nats-py reconnected: {during}"


def test_batcher_items_wait_no_longer_than_their_own_deadline(nats_cluster_module: EmbeddedNatsCluster,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream loses its quorum for longer than leader_wait: every item ends with leader_unavailable, retried
    only until its own deadline, leader_wait after it was submitted. Before, each group's retries held the queue
    and ran for leader_wait of their own, so the k-th group's items were sent and waited until k times leader_wait."""
    cluster = nats_cluster_module
    leader_wait, timeout = 5.0, 1.0
    settings = ConnectionSettings(servers=cluster.servers, connect_timeout=2, request_timeout=timeout,
                                  leader_wait=leader_wait)

    async def main() -> tuple[list[str], float, list[tuple[float, str]]]:
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "NOQUORUM", "subjects": ["noquorum.>"], "num_replicas": 3})
            survivor = connected_node(cluster, conn)
            for node in cluster.nodes:
                if node.name != survivor:
                    await asyncio.to_thread(cluster.kill, node.name)
            loop = asyncio.get_running_loop()
            sends: list[tuple[float, str]] = []  # (when, msg id) of each item written to the server

            async def recording_write_raw(nc: Any, frames: bytes) -> None:
                sends.extend((loop.time(), found.decode()) for found in re.findall(rb"Nats-Msg-Id: *(nq-\d+)", frames))
                await write_raw(nc, frames)

            monkeypatch.setattr(wire, "write_raw", recording_write_raw)
            async with Batcher(conn, max_batch=1, timeout=timeout, fence=False) as batcher:  # a group per item
                futures = [await batcher.submit(BatchMessage("noquorum.x", b"%d" % i, msg_id=f"nq-{i}"))
                           for i in range(4)]
                deadline = loop.time() + leader_wait  # no item's own deadline is later
                return [result.error for result in await asyncio.gather(*futures)], deadline, sends

    try:
        errors, deadline, sends = asyncio.run(main())
    finally:
        for node in cluster.nodes:
            node.start()
        cluster.wait_healthy()
    assert errors == ["leader_unavailable"] * 4
    assert sends[0][1] == "nq-0", sends  # the spy sees the Batcher's writes
    for i in range(4):
        times = [when for when, msg_id in sends if msg_id == f"nq-{i}"]
        # an item is sent only while its deadline has not passed, and re-sent only after a try failed before it
        # (client/retry.py): its first send and each one followed by another came before it, whatever the load.
        # Before, the k-th group's item was first sent about (k - 1) x leader_wait after its deadline.
        assert all(when < deadline for when in times[:1] + times[:-1]), (i, [round(t - deadline, 2) for t in times])


def test_an_aggregate_drops_what_its_workqueue_origin_stored_twice(nats_cluster_module: EmbeddedNatsCluster) -> None:
    """A WorkQueue origin forgets the msg ids of consumed messages when it loses its dedupe state (a leader
    restarted from its store; here: its short window ran out), so a re-send is stored again. The aggregate the
    provider creates has a duplicate window (the server gives a stream with sources none), so it keeps one copy."""
    cluster = nats_cluster_module
    settings = ConnectionSettings(servers=cluster.servers, connect_timeout=2, request_timeout=2)

    async def main() -> tuple[list[bool], list[str]]:
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "WQ_ORIGIN", "subjects": ["wqo.>"], "retention": "workqueue",
                                       "num_replicas": 3, "duplicate_window": 0.5})
            await provision_durable_source(conn, DurableSource(stream="WQ_AGG", source="WQ_ORIGIN"))

            async def origin_empty() -> bool:
                return (await stream_info(conn, "WQ_ORIGIN"))["state"]["messages"] == 0

            async def drained() -> None:  # the aggregate's server sources and acks what the origin holds
                await async_wait_until(origin_empty, "the origin drained into the aggregate", timeout=20)

            async with Batcher(conn, fence=False) as batcher:  # individual publishes, their msg ids
                for i in range(5):
                    await batcher.publish("wqo.x", b"%d" % i, msg_id=f"wq-{i}")
                await drained()
                resent = []
                for i in range(5):  # a re-send is answered "duplicate" (and not stored) until the id's window ran out

                    async def origin_forgot(i: int = i) -> bool:
                        answer = await batcher.publish("wqo.x", b"%d" % i, msg_id=f"wq-{i}")
                        if not answer.duplicate:
                            resent.append(answer)
                        return not answer.duplicate

                    await async_wait_until(origin_forgot, f"the origin storing a re-send of wq-{i} again (its 0.5 s "
                                           "duplicate window ran out)", timeout=20)
                await drained()
            stored = (await stream_info(conn, "WQ_AGG"))["state"]["last_seq"]
            ids = [(await conn.js.get_msg("WQ_AGG", seq)).headers["Nats-Msg-Id"] for seq in range(1, stored + 1)]
            return [r.duplicate for r in resent], ids

    duplicate_answers, ids = asyncio.run(main())
    assert duplicate_answers == [False] * 5, "the origin stored the re-sends again (it had forgotten the ids)"
    assert sorted(ids) == [f"wq-{i}" for i in range(5)], ids


def test_a_cluster_without_advertised_urls_still_gets_r3_by_default(tmp_path) -> None:
    """``cluster { no_advertise: true }`` hides connect_urls; the default replicas must still be 3 (was 1)."""
    with EmbeddedNatsCluster(size=3, store_dir=tmp_path / "noadv", cluster={"no_advertise": True}) as cluster:
        settings = ConnectionSettings(servers=cluster.nodes[0].url, connect_timeout=2, request_timeout=2)

        async def main() -> tuple[list, int, int]:
            async with open_connection(settings) as conn:
                urls = conn.nc._server_info.get("connect_urls")
                capture = await ensure_capture_stream(conn, "NOADV_ADVISORIES")
                ledger = await BatchLedger.open(conn, "noadv_ledger")
                bucket = (await stream_info(conn, "KV_noadv_ledger"))["config"]["num_replicas"]
                assert ledger is not None
                return urls, capture["info"]["config"]["num_replicas"], bucket

        urls, capture_replicas, ledger_replicas = asyncio.run(main())
    assert not urls, "no_advertise hides the other servers"
    assert capture_replicas == 3 and ledger_replicas == 3


def test_creating_r3_before_every_known_server_has_joined_waits_for_them(
        nats_cluster_module: EmbeddedNatsCluster) -> None:
    """Right after a restart of the cluster the meta leader knows a peer it has not heard from yet: a create is
    refused with 10005 "no suitable peers for placement, peer offline" and is retried (leader_wait) until the
    peer joins, instead of failing with advice to lower num_replicas."""
    cluster = nats_cluster_module
    late = cluster.nodes[2]
    for node in cluster.nodes:
        node.stop()
    for node in cluster.nodes[:2]:
        node.start()
    early = ",".join(node.url for node in cluster.nodes[:2])
    settings = ConnectionSettings(servers=early, connect_timeout=2, request_timeout=2, leader_wait=60)
    config = {"name": "PEERS", "subjects": ["peers.>"], "num_replicas": 3}

    async def main() -> tuple[PlacementError | None, dict]:
        async with open_connection(settings) as conn:
            refused = None
            for _ in range(30):  # bounded: until the two servers elected a meta leader, which then refuses
                try:
                    await conn.api_request("STREAM.CREATE.PEERS", config, retry=False)
                except PlacementError as exc:
                    refused = exc
                    break
                except LeaderUnavailableError:
                    continue
            creating = asyncio.ensure_future(ensure_stream(conn, config))
            await asyncio.to_thread(late.start)
            return refused, await creating

    try:
        refused, created = asyncio.run(main())
    finally:
        for node in cluster.nodes:
            node.start()
        cluster.wait_healthy()
    assert refused is not None and refused.reason == "peers_offline" and "start them" in str(refused)
    assert created["action"] == "created" and created["info"]["config"]["num_replicas"] == 3
