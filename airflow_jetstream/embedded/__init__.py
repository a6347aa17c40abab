"""A real ``nats-server`` on loopback for tests, demos and local development."""

from airflow_jetstream.embedded.server import EmbeddedNatsServer, find_nats_server_binary

__all__ = ["EmbeddedNatsServer", "find_nats_server_binary"]
