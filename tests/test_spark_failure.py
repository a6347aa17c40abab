"""A failed Spark job ends its task with one clear cause, not spark-submit's exit code."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from airflow.exceptions import AirflowException

from airflow_jetstream.operators.spark_failure import SparkFailureCause
from airflow_jetstream.operators.spark_submit import JetStreamSparkSubmitOperator
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


@pytest.mark.spark
def test_a_failed_job_ends_the_task_with_its_cause(nats_server, tmp_path: Path, monkeypatch) -> None:
    app = tmp_path / "write_to_a_missing_stream.py"
    app.write_text(textwrap.dedent("""
        from pyspark.sql import SparkSession
        from airflow_jetstream.spark import register

        spark = SparkSession.builder.getOrCreate()
        register(spark)
        spark.range(10).selectExpr("CAST(id AS STRING) AS payload").write.format("jetstream") \\
            .mode("append").option("stream", "NOSTREAM").option("subject", "nostream.x").save()
    """))
    monkeypatch.setenv("AIRFLOW_CONN_NATS_DEFAULT", nats_conn_json(nats_server.url))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    operator = JetStreamSparkSubmitOperator(task_id="write", application=str(app),
                                            conf={"spark.ui.enabled": "false"})
    with pytest.raises(AirflowException) as failed:
        operator.execute(context={})
    assert str(failed.value).startswith("the Spark job failed: StreamNotFoundError: stream 'NOSTREAM'")
    assert "(reason: stream_not_found)" in str(failed.value)
    assert "Cannot execute" in str(failed.value.__cause__), "spark-submit's own error stays chained"
