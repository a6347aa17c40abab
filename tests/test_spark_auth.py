"""The data source reaches authenticated servers with the connection handed over as Spark conf.

Each auth kind (user/password, token, nkey seed, creds file, TLS with a client certificate) once:
the conf a JetStreamSparkSubmitOperator would write (``spark.jetstream.*``), ``register(spark)``,
then a write and a read that give no ``servers`` or credentials as options. One local[2] session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream
from airflow_jetstream.client.errors import AuthenticationError
from airflow_jetstream.spark.driver import CONF_PREFIX, settings_to_conf
from tests.conftest import AUTH_PASSWORD, AUTH_TOKEN, AUTH_USER
from tests.support.nats_calls import call_on_server, stored_rows
from tests.support.spark_session import local_spark

pytest.importorskip("pyspark")
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_jetstream.spark import register

ROWS = 300


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield from local_spark("test-jetstream-auth", register_source=False)


def hand_over(spark: SparkSession, settings: ConnectionSettings) -> None:
    """What the operator's properties file does, at run time: conf entries, then register()."""
    for key in [k for k in spark.conf.getAll if k.startswith(CONF_PREFIX)]:
        spark.conf.unset(key)
    for key, value in settings_to_conf(settings).items():
        spark.conf.set(key, value)
    register(spark)


def write_then_read(spark: SparkSession, settings: ConnectionSettings, stream: str, **options: str) -> int:
    call_on_server(settings, ensure_stream, {"name": stream, "subjects": [f"{stream.lower()}.>"],
                                             "allow_atomic": True})
    rows = spark.range(0, ROWS, numPartitions=2).select(
        F.concat(F.lit(f"{stream.lower()}."), (F.col("id") % 3).cast("string")).alias("subject"),
        F.col("id").cast("string").alias("payload"),
    )
    rows.write.format("jetstream").mode("append").options(stream=stream, job_id=stream.lower(), **options).save()
    assert call_on_server(settings, stored_rows, stream) == ROWS
    read = spark.read.format("jetstream").options(stream=stream, decode="utf-8", **options).load()
    return read.select(F.col("payload").cast("int")).distinct().count()


def auth_settings(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> ConnectionSettings:
    if kind == "user_password":
        server = request.getfixturevalue("user_server")
        return ConnectionSettings(servers=server.url, user=AUTH_USER, password=AUTH_PASSWORD)
    if kind == "token":
        return ConnectionSettings(servers=request.getfixturevalue("token_server").url, token=AUTH_TOKEN)
    if kind == "nkey":
        server = request.getfixturevalue("nkey_server")
        return ConnectionSettings(servers=server.url, nkey_seed_secret=request.getfixturevalue("nkey_user")[0])
    if kind == "creds":
        from tests.support.jwt_auth import make_decentralized_auth

        auth = make_decentralized_auth(tmp_path / "auth")
        server = request.getfixturevalue("nats_server_factory")(config=auth.server_config)
        return ConnectionSettings(servers=server.url, creds_file=str(auth.creds_file))
    tls = request.getfixturevalue("tls_files")
    return ConnectionSettings(servers=request.getfixturevalue("tls_server").url, tls_ca_file=str(tls.ca),
                              tls_cert_file=str(tls.client_cert), tls_key_file=str(tls.client_key))


@pytest.mark.parametrize("kind", ["user_password", "token", "nkey", "creds", "tls"])
def test_each_auth_kind_from_the_handed_over_connection(spark, request, tmp_path, kind) -> None:
    settings = auth_settings(kind, request, tmp_path)
    hand_over(spark, settings)
    assert write_then_read(spark, settings, f"AUTH_{kind.upper()}") == ROWS


def test_explicit_options_win_over_the_handed_over_connection(spark, user_server) -> None:
    good = ConnectionSettings(servers=user_server.url, user=AUTH_USER, password=AUTH_PASSWORD)
    hand_over(spark, good.with_overrides(password="wrong-password"))
    # options naming any credential replace all of the conf's credentials
    assert write_then_read(spark, good, "OPTIONS_WIN", user=AUTH_USER, password=AUTH_PASSWORD) == ROWS
    hand_over(spark, good)
    with pytest.raises(Exception) as err:  # Spark wraps the driver-side error in its own
        spark.read.format("jetstream").options(stream="OPTIONS_WIN", token="not-the-token").load().count()
    assert AuthenticationError.__name__ in str(err.value) or "Authorization" in str(err.value)
    assert "not-the-token" not in str(err.value)


def test_settings_given_to_register_win_and_travel_in_the_source_not_in_conf(spark, user_server) -> None:
    settings = ConnectionSettings(servers=user_server.url, user=AUTH_USER, password=AUTH_PASSWORD)
    hand_over(spark, settings.with_overrides(password="wrong-password"))
    conf_before = {k: v for k, v in spark.conf.getAll.items() if k.startswith(CONF_PREFIX)}
    register(spark, settings, ship_package=True)  # classic: the zip through SparkContext.addPyFile
    assert write_then_read(spark, settings, "REGISTERED") == ROWS
    assert {k: v for k, v in spark.conf.getAll.items() if k.startswith(CONF_PREFIX)} == conf_before
    assert AUTH_PASSWORD not in str(conf_before)
    assert any(f.endswith("airflow_jetstream_spark.zip") for f in spark.sparkContext.listFiles)
