"""The JetStream view's stream problems on a real 3-node cluster: a node dies, the R3 stream it held a replica of
shows that replica offline, and the R1 stream it led has no leader (the listing names it without info)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsCluster
from airflow_jetstream.ui.problems import Observations
from airflow_jetstream.ui.snapshot import ReadKey, ViewSettings, read_snapshot
from tests.support.polling import wait_for


def test_a_dead_node_shows_as_replica_offline_and_a_stream_without_leader(nats_cluster: EmbeddedNatsCluster) -> None:
    settings = ConnectionSettings(servers=nats_cluster.servers, connect_timeout=2, request_timeout=10)
    replicated, single = f"REPL_{uuid.uuid4().hex[:6]}", f"SOLO_{uuid.uuid4().hex[:6]}"

    async def create() -> None:
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": replicated, "subjects": [f"{replicated}.>"], "num_replicas": 3})
            await ensure_stream(conn, {"name": single, "subjects": [f"{single}.>"], "num_replicas": 1})

    asyncio.run(create())
    leader = wait_for(lambda: nats_cluster.stream_leader(single), f"a leader for {single}")
    wait_for(lambda: nats_cluster.stream_leader(replicated), f"a leader for {replicated}")
    # a listing with a node down waits for the streams it led: more than the default 5 s request bound here
    view, seen = ViewSettings(timeout=30.0, request_timeout=10.0), Observations()

    def problems() -> dict[str, set[str]]:
        async def read() -> dict:
            loop = asyncio.get_running_loop()
            key = ReadKey("cluster", "batch_ledger", "ADVISORIES")
            return await read_snapshot(key, settings, view, seen, deadline=loop.time() + view.timeout)

        snapshot = asyncio.run(read())
        found: dict[str, set[str]] = {"read": {f"{snapshot['elapsed_ms']} ms", str(snapshot.get("error"))}}
        for problem in snapshot.get("problems") or []:
            found.setdefault(problem["kind"], set()).add(problem["object"].get("stream") or
                                                         problem["object"].get("name") or "")
        return found

    def healthy_view() -> dict[str, set[str]] | None:  # a listing just after the creates may miss a new stream's info
        last[:] = [problems()]
        return None if {"replica_offline", "replica_lagging", "stream_no_leader"} & set(last[0]) else last[0]

    last: list[dict[str, set[str]]] = []
    try:
        healthy = wait_for(healthy_view, "a view without replica or leader problems", limit=60)
    except pytest.fail.Exception:
        raise AssertionError(f"the problems found last: {last}") from None
    assert "None" in healthy["read"], healthy

    nats_cluster.kill(leader)
    try:
        def flagged() -> dict[str, set[str]] | None:
            last[:] = [problems()]
            offline = replicated in last[0].get("replica_offline", set()) | last[0].get("replica_lagging", set())
            return last[0] if offline and single in last[0].get("stream_no_leader", set()) else None

        try:
            found = wait_for(flagged, f"{replicated}'s replica offline and {single} without a leader", limit=90)
        except pytest.fail.Exception:
            raise AssertionError(f"the problems found last: {last}") from None
        assert single in found["stream_no_leader"]
    finally:
        nats_cluster.restart(leader)
