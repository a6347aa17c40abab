"""A failed Spark job ends its task with one clear cause, not spark-submit's exit code: the job's driver
records it (airflow_jetstream/spark/driver.py), the operator reads it; the Spark provider's hook is used as
Airflow builds it (no method of it replaced but ``submit``, which starts spark-submit as the task's child)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from airflow.exceptions import AirflowException
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_jetstream.operators.spark_submit import JetStreamSparkSubmitOperator, _TaskChildSubmitHook
from airflow_jetstream.spark.driver import FAILURE_FILE_CONF, SparkFailureCause, record_failures
from tests.support.airflow_cli import nats_conn_json

#: What spark-submit printed for a job whose executor refused a message (trimmed; from a real run).
SPARK_OUTPUT = (Path(__file__).parent / "support" / "spark_failed_job_output.txt").read_text()


def test_the_first_error_of_the_package_is_the_cause() -> None:
    cause = SparkFailureCause()
    assert list(cause.watch(SPARK_OUTPUT.splitlines())) == SPARK_OUTPUT.splitlines(), "lines pass unchanged"
    assert cause.cause == (
        "InvalidRequestError: message 77 (s.x) is 2000196 bytes with headers, over the connection's max_payload "
        "of 1048576 bytes; make it smaller or raise the server's max_payload (reason: payload_too_large)")


def test_without_an_error_of_the_package_the_last_exception_is_the_cause() -> None:
    cause = SparkFailureCause()
    for line in [b"java.lang.OutOfMemoryError: Java heap space", "Exception in thread main",
                 "py4j.protocol.Py4JJavaError: An error occurred while calling o42.save."]:
        cause.feed(line)
    assert cause.cause == "Py4JJavaError: An error occurred while calling o42.save."
    assert SparkFailureCause().cause is None


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class _Session:
    def __init__(self, **conf: str) -> None:
        self.conf = _Conf(conf)


def test_the_driver_records_the_cause_of_the_exception_that_ends_it(tmp_path: Path, monkeypatch) -> None:
    seen: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, error, tb: seen.append(kind))
    record = tmp_path / "failure.txt"
    record_failures(_Session(**{FAILURE_FILE_CONF: str(record)}))
    record_failures(_Session(**{FAILURE_FILE_CONF: str(record)}))  # register() again: one hook, not two
    try:
        raise RuntimeError(SPARK_OUTPUT)  # what pyspark raises in the driver carries the executor's traceback
    except RuntimeError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    assert record.read_text() == (
        "InvalidRequestError: message 77 (s.x) is 2000196 bytes with headers, over the connection's max_payload "
        "of 1048576 bytes; make it smaller or raise the server's max_payload (reason: payload_too_large)")
    assert seen == [RuntimeError], "the previous hook still prints the traceback, once"


def test_outside_the_operator_nothing_is_recorded(monkeypatch) -> None:
    before = sys.excepthook
    record_failures(_Session())
    assert sys.excepthook is before


def _spark_env(monkeypatch, nats_server) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NATS_DEFAULT", nats_conn_json(nats_server.url))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


WRITE_TO_A_MISSING_STREAM = """
    from pyspark.sql import SparkSession
    from airflow_jetstream.spark import register

    spark = SparkSession.builder.getOrCreate()
    register(spark)
    spark.range(10).selectExpr("CAST(id AS STRING) AS payload").write.format("jetstream") \\
        .mode("append").option("stream", "NOSTREAM").option("subject", "nostream.x").save()
"""


@pytest.mark.spark
def test_a_failed_job_ends_the_task_with_its_cause(nats_server, tmp_path: Path, monkeypatch) -> None:
    app = tmp_path / "write_to_a_missing_stream.py"
    app.write_text(textwrap.dedent(WRITE_TO_A_MISSING_STREAM))
    _spark_env(monkeypatch, nats_server)
    operator = JetStreamSparkSubmitOperator(task_id="write", application=str(app),
                                            conf={"spark.ui.enabled": "false"})
    with pytest.raises(AirflowException) as failed:
        operator.execute(context={})
    assert str(failed.value).startswith("the Spark job failed: StreamNotFoundError: stream 'NOSTREAM'")
    assert "(reason: stream_not_found)" in str(failed.value)
    assert "Cannot execute" in str(failed.value.__cause__), "spark-submit's own error stays chained"
    hook = operator._hook
    assert isinstance(hook, SparkSubmitHook) and type(hook) is _TaskChildSubmitHook, "started as the task's child"
    assert "_process_spark_submit_log" not in vars(hook), "the provider's hook runs as Airflow built it"


#: Values planted in the task's environment; none may reach spark-submit, the driver or a Python worker.
PLANTED = {"token": "tok-planted-8f3a91c2", "ssn": "078-05-1120", "api": "key-planted-55e0c7"}

REPORT_ENVIRONMENTS = """
    import json, os, sys
    from pyspark.sql import SparkSession
    from airflow_jetstream.spark import register

    spark = SparkSession.builder.getOrCreate()
    register(spark)
    workers = spark.sparkContext.parallelize(range(2), 2).map(lambda _: dict(os.environ)).collect()
    report = {"driver": dict(os.environ), "jvm": dict(spark._jvm.System.getenv()), "workers": workers,
              "conf_token": bool(spark.conf.get("spark.jetstream.secret.token", None))}
    with open(sys.argv[1], "w") as out:
        json.dump(report, out)
"""


@pytest.mark.spark
def test_spark_processes_get_no_secret_variable_of_the_task(nats_server, tmp_path: Path, monkeypatch) -> None:
    """spark-submit's JVM (the driver's, in client mode), the driver's Python and every Python worker get none
    of the task's AIRFLOW_CONN_* / AIRFLOW_VAR_* / secret-named variables; the connection reaches the job
    through the private properties file (docs/spark.md)."""
    app, report = tmp_path / "report_environments.py", tmp_path / "report.json"
    app.write_text(textwrap.dedent(REPORT_ENVIRONMENTS))
    _spark_env(monkeypatch, nats_server)
    monkeypatch.setenv("AIRFLOW_CONN_NATS_DEFAULT", nats_conn_json(nats_server.url, extra={"token": PLANTED["token"]}))
    monkeypatch.setenv("AIRFLOW_VAR_CUSTOMER", json.dumps({"ssn": PLANTED["ssn"]}))
    monkeypatch.setenv("BILLING_API_KEY", PLANTED["api"])
    JetStreamSparkSubmitOperator(task_id="report", application=str(app), application_args=[str(report)],
                                 conf={"spark.ui.enabled": "false"}).execute(context={})
    text = report.read_text()
    found = {name: value for name, value in PLANTED.items() if value in text}
    assert not found, f"secret values in a Spark process's environment: {sorted(found)}"
    seen = json.loads(text)
    assert seen["workers"] and seen["jvm"] and "PYSPARK_PYTHON" in seen["driver"], "the rest of the environment"
    assert seen["conf_token"], "the token travels in the properties file, as spark.jetstream.secret.token"
