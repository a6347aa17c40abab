"""A Spark Connect server on 127.0.0.1 whose Python workers lack the project's packages."""

from __future__ import annotations

from pathlib import Path

from tests.infra.spark_connect import EmbeddedSparkConnectServer
from tests.support.bare_python import make_bare_python


def bare_connect_server(home: Path) -> EmbeddedSparkConnectServer:
    """A server (not started: use it as a context manager) from pyspark's own distribution, its files in
    ``home``: workers that import ``airflow_jetstream`` and nats-py only from a shipped zip, and an
    uncompressed event log in ``home/events`` (what the history server and the UI's SQL tab show)."""
    events = home / "events"
    events.mkdir(parents=True, exist_ok=True)
    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{events}",
            "spark.eventLog.compress": "false", "spark.sql.shuffle.partitions": "2"}
    env = {"PYSPARK_PYTHON": str(make_bare_python(home / "bare-python"))}
    return EmbeddedSparkConnectServer(conf=conf, env=env, base_dir=home / "server")
