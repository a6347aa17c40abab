"""A real ``nats-server`` (or a cluster of them) on loopback for tests, demos and local development."""

from airflow_jetstream.embedded.cluster import EmbeddedNatsCluster
from airflow_jetstream.embedded.server import EmbeddedNatsServer, find_nats_server_binary

__all__ = ["EmbeddedNatsCluster", "EmbeddedNatsServer", "find_nats_server_binary"]
