"""Apache Airflow provider for NATS JetStream."""

from airflow_jetstream.version import __version__

__all__ = ["__version__"]
