"""The embedded 3-node cluster itself: routes, R3 placement, leader lookups, SIGKILL and restart."""

from __future__ import annotations

import asyncio

import nats
import pytest

from airflow_jetstream.embedded import EmbeddedNatsCluster
from airflow_jetstream.hooks.jetstream import JetStreamHook
from tests.conftest import set_nats_cluster_connection
from tests.support.polling import wait_for


async def _stream_info(cluster: EmbeddedNatsCluster, name: str, create: bool = False):
    nc = await nats.connect(cluster.urls, connect_timeout=2)
    try:
        js = nc.jetstream(timeout=10)
        if create:
            await js.add_stream(name=name, subjects=[f"{name.lower()}.>"], num_replicas=3)
            # A new R3 stream answers publishes once its first leader is elected.
            wait_for(lambda: cluster.stream_leader(name), f"a first leader of {name}")
            for i in range(5):
                await js.publish(f"{name.lower()}.x", str(i).encode())
        return await js.stream_info(name)
    finally:
        await nc.close()


def test_cluster_nodes_are_named_and_routed(nats_cluster_module: EmbeddedNatsCluster) -> None:
    cluster = nats_cluster_module
    assert [n.name for n in cluster.nodes] == ["n1", "n2", "n3"]
    assert cluster.servers.split(",") == cluster.urls
    for node in cluster.nodes:
        routes = {r["remote_name"] for r in node.monitor("routez")["routes"]}
        assert routes == {"n1", "n2", "n3"} - {node.name}
    assert cluster.meta_leader() in {"n1", "n2", "n3"}


def test_r3_stream_has_three_peers(nats_cluster_module: EmbeddedNatsCluster) -> None:
    info = asyncio.run(_stream_info(nats_cluster_module, "PEERS", create=True))
    peers = {info.cluster.leader} | {r.name for r in info.cluster.replicas}
    assert peers == {"n1", "n2", "n3"}
    assert nats_cluster_module.stream_leader("PEERS") == info.cluster.leader


def test_killing_the_stream_leader_elects_another_and_restart_rejoins(
    nats_cluster_module: EmbeddedNatsCluster,
) -> None:
    cluster = nats_cluster_module
    asyncio.run(_stream_info(cluster, "ELECT", create=True))
    old = cluster.stream_leader("ELECT")
    assert old is not None
    cluster.kill(old)
    assert cluster.node(old).process is None
    new = wait_for(lambda: (cluster.stream_leader("ELECT") or old) != old and cluster.stream_leader("ELECT"),
                   "a new stream leader")
    assert new != old
    cluster.restart(old)
    info = asyncio.run(_stream_info(cluster, "ELECT"))
    assert info.state.messages == 5
    assert {info.cluster.leader} | {r.name for r in info.cluster.replicas} == {"n1", "n2", "n3"}


def test_airflow_connection_lists_every_node(
    monkeypatch: pytest.MonkeyPatch, nats_cluster_module: EmbeddedNatsCluster
) -> None:
    set_nats_cluster_connection(monkeypatch, "nats_cluster", nats_cluster_module)
    settings = JetStreamHook("nats_cluster").get_settings()
    assert list(settings.servers) == nats_cluster_module.urls
