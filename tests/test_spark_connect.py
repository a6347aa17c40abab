"""The data source over Spark Connect: one registration carrying the connection, and the shipped package.

One Spark Connect server for the module, started from pyspark's own distribution on 127.0.0.1
(``EmbeddedSparkConnectServer``), whose Python workers cannot import ``airflow_jetstream`` or
nats-py from the venv (a ``sitecustomize`` refuses them unless they come from a shipped zip), with
an uncompressed event log (what the history server and the UI's SQL tab show). The NATS server
requires a user and password; the password is given only as ``register(spark, settings)``, the
settings from a ``nats`` Airflow connection through ``JetStreamHook`` (the ``@task.pyspark`` recipe).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream
from tests.conftest import AUTH_PASSWORD, AUTH_USER, set_nats_connection
from tests.infra.spark_connect import EmbeddedSparkConnectServer
from tests.support.nats_calls import call_on_server, stored_rows
from tests.support.spark_connect import bare_connect_server

pytest.importorskip("pyspark")
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_jetstream.spark import register

ROWS = 200


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedSparkConnectServer]:
    with bare_connect_server(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server


@pytest.fixture
def session(connect_server: EmbeddedSparkConnectServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[SparkSession]:
    """A new Connect session (its own artifacts and registrations) per test."""
    # pyspark marks the process as Spark Connect (SPARK_CONNECT_MODE_ENABLED) and stop() keeps the mark, so
    # every later local[2] session in this process would refuse to start: monkeypatch removes it after the test
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    spark = SparkSession.builder.remote(connect_server.url).create()
    yield spark
    spark.stop()


@pytest.fixture
def nats_settings(user_server, monkeypatch) -> ConnectionSettings:
    """The settings as the ``@task.pyspark`` recipe gets them: from a ``nats`` Airflow connection."""
    from airflow_jetstream.hooks.jetstream import JetStreamHook

    set_nats_connection(monkeypatch, "nats_connect", user_server.url, login=AUTH_USER, password=AUTH_PASSWORD)
    settings = JetStreamHook("nats_connect").settings
    assert settings.password == AUTH_PASSWORD
    return settings


def orders(spark: SparkSession, stream: str):
    return spark.range(0, ROWS, numPartitions=2).select(
        F.concat(F.lit(f"{stream.lower()}."), (F.col("id") % 3).cast("string")).alias("subject"),
        F.col("id").cast("string").alias("payload"),
    )


def test_without_the_shipped_package_the_workers_cannot_load_the_source(session, nats_settings) -> None:
    register(session, nats_settings)
    with pytest.raises(Exception, match="airflow_jetstream is not installed for this Python") as err:
        session.read.format("jetstream").options(stream="NONE").load().count()
    assert AUTH_PASSWORD not in str(err.value)


def write_then_read(session: SparkSession, settings: ConnectionSettings, stream: str) -> None:
    """Write ROWS through the data source, check the stream holds them, read them back."""
    call_on_server(settings, ensure_stream, {"name": stream, "subjects": [f"{stream.lower()}.>"],
                                             "allow_atomic": True})
    orders(session, stream).write.format("jetstream").mode("append").options(
        stream=stream, job_id=f"{stream.lower()}-1").save()
    assert call_on_server(settings, stored_rows, stream) == ROWS
    read = session.read.format("jetstream").options(stream=stream, decode="utf-8").load()
    assert read.select(F.col("payload").cast("int")).distinct().count() == ROWS


def test_read_write_round_trip_with_the_shipped_package_and_the_connection_in_the_source(
        session, nats_settings) -> None:
    register(session, nats_settings, ship_package=True)
    register(session, nats_settings, ship_package=True)  # again: adding the same artifact is a no-op
    write_then_read(session, nats_settings, "CONNECT")
    assert not [key for key in session.conf.getAll if key.startswith("spark.jetstream")]


def test_nkey_seed_connection_through_the_shipped_package(session, nkey_server, nkey_user) -> None:
    """The workers have pyspark and ``nkeys`` (with PyNaCl, which cannot come from a zip) but neither the
    package nor nats-py: what docs/spark.md asks to install beside the zip for nkey and creds auth."""
    settings = ConnectionSettings(servers=nkey_server.url, nkey_seed_secret=nkey_user[0])
    register(session, settings, ship_package=True)
    write_then_read(session, settings, "CONNECT_NKEY")


def test_streaming_over_connect_needs_the_package_on_the_server(session, nats_settings, tmp_path) -> None:
    """The server's streaming planner sees no session artifact (docs/spark.md, "Streaming over Spark
    Connect"): this fails once a pyspark release makes ship_package enough for streaming too."""
    call_on_server(nats_settings, ensure_stream, {"name": "CONNECT_FEED", "subjects": ["feed.>"]})
    register(session, nats_settings, ship_package=True)
    assert session.read.format("jetstream").options(stream="CONNECT_FEED").load().count() == 0  # batch: fine
    with pytest.raises(Exception, match="airflow_jetstream is not installed for this Python"):
        query = (session.readStream.format("jetstream").options(stream="CONNECT_FEED").load()
                 .writeStream.format("memory").queryName("feed").trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        query.awaitTermination(120)
        if query.exception() is not None:
            raise query.exception()


def test_the_password_is_in_no_server_log_or_event_log(connect_server) -> None:
    """Runs last: stops the server so the event log is complete, then scans every file it wrote."""
    connect_server.close()
    files = [p for p in connect_server.base_dir.parent.rglob("*") if p.is_file()]
    texts = {str(p): p.read_text(errors="replace") for p in files}
    events = "\n".join(text for name, text in texts.items() if "/events/" in name)
    # the history server and the UI show the SQL plans and each Connect statement; the registration's
    # pickled data source (which holds the settings) is shown truncated to its first bytes
    assert "SparkListenerSQLExecutionStart" in events and 'format: \\"jetstream\\"' in events
    assert "register_data_source" in events and "[truncated(size=" in events
    assert "shipped import: airflow_jetstream from " in connect_server.log()
    assert [name for name, text in texts.items() if AUTH_PASSWORD in text] == []
