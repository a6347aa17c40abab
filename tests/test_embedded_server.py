"""The embedded single server: a port taken between choosing it and binding it is chosen again."""

from __future__ import annotations

import socket
from pathlib import Path

from airflow_jetstream.embedded import EmbeddedNatsServer


def test_a_monitor_port_taken_before_the_bind_is_replaced(tmp_path: Path) -> None:
    server = EmbeddedNatsServer(store_dir=tmp_path / "nats")
    taken = server.monitor_port
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", taken))
        blocker.listen()
        with server:
            assert server.monitor_port != taken
            assert server.monitor("varz")["http_port"] == server.monitor_port
