"""The embedded single server: a port taken between choosing it and binding it is chosen again."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.embedded.server import LOWEST_PORT, free_port


def test_a_monitor_port_taken_before_the_bind_is_replaced(tmp_path: Path) -> None:
    server = EmbeddedNatsServer(store_dir=tmp_path / "nats")
    taken = server.monitor_port
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", taken))
        blocker.listen()
        with server:
            assert server.monitor_port != taken
            assert server.monitor("varz")["http_port"] == server.monitor_port


def test_a_monitor_port_answered_by_another_nats_server_is_replaced(tmp_path: Path) -> None:
    """Another server's client port on the chosen monitor port answers the health check with NATS' INFO line,
    not HTTP: that is a port taken too (it escaped start() as http.client.BadStatusLine)."""
    with EmbeddedNatsServer(store_dir=tmp_path / "squatter") as squatter:
        server = EmbeddedNatsServer(store_dir=tmp_path / "nats")
        server.monitor_port = squatter.port
        with server:
            assert server.monitor_port != squatter.port
            assert server.monitor("varz")["port"] == server.port


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux's ephemeral range")
def test_free_ports_come_from_below_the_kernels_ephemeral_range() -> None:
    """A port from the ephemeral range can become another process's outgoing connection or bind(0) before the
    server binds it (a CI run: the Spark master's status page moved to the next port, and another process
    answered on the one chosen)."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(500)]
    assert [p for p in ports if not LOWEST_PORT <= p < ephemeral_low] == []


def test_free_ports_handed_out_together_are_all_different() -> None:
    """A cluster picks 9 ports before any server binds one: the same port twice made one node's health check
    reach another node's client port."""
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
