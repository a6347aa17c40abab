"""The embedded Spark standalone cluster and Spark Connect server when a port they chose is taken before their
JVM binds it.

A port is chosen free, then bound by a JVM seconds later; meanwhile another process may take it (a Spark
driver's or executor's ephemeral port, another test's server). The standalone master does not fail then: it
binds the next port and says so only in its log, and the cluster read its status from the port it chose (a CI
run's ``BadStatusLine``). The Spark Connect server exits instead ("Failed to bind"), and its start failed.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.infra.spark_cluster import EmbeddedSparkCluster
from tests.infra.spark_connect import EmbeddedSparkConnectServer

NOT_HTTP = b"\x00\x00\x00\x0bnot-http\xff\n"


@contextmanager
def squatter(port: int) -> Iterator[list[int]]:
    """Another process's server on ``port`` of 127.0.0.1: answers each connection with bytes that are not HTTP.
    Yields the list of connections it answered."""
    server = socket.create_server(("127.0.0.1", port))
    answered: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.sendall(NOT_HTTP)
                answered.append(port)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield answered
    finally:
        server.close()
        thread.join(timeout=10)


def test_a_cluster_whose_chosen_ports_were_taken_runs_on_the_ports_spark_bound(tmp_path: Path) -> None:
    cluster = EmbeddedSparkCluster(workers=1, base_dir=tmp_path)
    chosen_port, chosen_web_port = cluster.port, cluster.web_port
    with squatter(chosen_port), squatter(chosen_web_port) as web_squatter, cluster:
        assert cluster.port != chosen_port and cluster.web_port != chosen_web_port
        assert cluster.master_url == f"spark://127.0.0.1:{cluster.port}"
        assert cluster.status()["aliveworkers"] == 1, "the worker found the master where it bound"
        assert web_squatter == [], "the cluster's status was read from the other process"


def test_a_connect_server_whose_chosen_port_was_taken_starts_on_another(tmp_path: Path, monkeypatch) -> None:
    from pyspark.sql import SparkSession

    server = EmbeddedSparkConnectServer(base_dir=tmp_path)
    chosen = server.port
    with squatter(chosen) as answered, server:
        assert server.port != chosen and server.url == f"sc://127.0.0.1:{server.port}"
        monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")  # see tests/test_spark_connect.py's session
        spark = SparkSession.builder.remote(server.url).create()
        try:
            assert spark.range(3).count() == 3
        finally:
            spark.stop()
        assert answered == [], "the client reached the other process"
