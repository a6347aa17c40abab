"""A real ``nats-server`` (or a cluster of them) on loopback for tests, demos and local development.

Shipped for users' own tests (see :mod:`airflow_jetstream.testing`); the provider's runtime
code (hook, operators, sensors, triggers, Spark data source) never imports this package.
"""

from airflow_jetstream.embedded.cluster import EmbeddedNatsCluster
from airflow_jetstream.embedded.server import EmbeddedNatsServer

__all__ = ["EmbeddedNatsCluster", "EmbeddedNatsServer"]
