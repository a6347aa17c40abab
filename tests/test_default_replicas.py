"""Default replicas on a lone server that has a ``cluster`` block (JetStream runs unclustered there)."""

from __future__ import annotations

import asyncio
import logging

from airflow_jetstream.client.admin.streams import default_replicas
from airflow_jetstream.client.advisories.capture import ensure_capture_stream
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.settings import ConnectionSettings


def test_a_lone_server_naming_a_cluster_gets_r1_after_refusing_r3(nats_server_factory, caplog):
    # a cluster block without a route listener (port 0): INFO names the cluster, JetStream runs unclustered
    server = nats_server_factory(config={"server_name": "lone", "cluster": {"name": "lone", "host": "127.0.0.1",
                                                                            "port": 0}})
    settings = ConnectionSettings(servers=server.url, connect_timeout=2, request_timeout=2)

    async def main() -> tuple[int, int, int]:
        async with open_connection(settings) as conn:
            first = default_replicas(conn)
            created = await ensure_capture_stream(conn, "LONE_ADVISORIES")
            await ensure_capture_stream(conn, "LONE_ADVISORIES")  # exists: nothing to say
            return first, created["info"]["config"]["num_replicas"], default_replicas(conn)

    with caplog.at_level(logging.INFO, logger="airflow_jetstream.client.admin.streams"):
        first, created, after = asyncio.run(main())
    assert (first, created, after) == (3, 1, 1)
    assert any("runs JetStream unclustered" in r.getMessage() for r in caplog.records)
    # the default is said once, where a stream is created with it (asking for it, or ensuring what exists, logs nothing)
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if "replica(s)" in m or "by default" in m] == [
        "created stream LONE_ADVISORIES with 1 replica(s) (the default)"]
