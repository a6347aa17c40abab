"""A host without Java fails the Spark task in one line naming the host and the fix
(airflow_jetstream/operators/spark_java.py), before spark-submit starts: spark-class alone says "JAVA_HOME is not
set" inside the provider's "Cannot execute"."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from airflow_jetstream.client.errors import SparkInstallError
from airflow_jetstream.operators.spark_java import check_java, java_missing
from airflow_jetstream.operators.spark_submit import JetStreamSparkSubmitOperator
from tests.support.airflow_cli import nats_conn_json


def fake_java(folder: Path) -> Path:
    folder.mkdir(parents=True)
    java = folder / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    return java


def test_java_is_found_where_spark_class_looks(tmp_path: Path) -> None:
    fake_java(tmp_path / "jdk" / "bin")
    assert java_missing({"JAVA_HOME": str(tmp_path / "jdk"), "PATH": ""}) is None
    assert java_missing({"PATH": str(tmp_path / "jdk" / "bin")}) is None
    assert java_missing({"PATH": str(tmp_path)}) == "JAVA_HOME is not set and no java on PATH"
    # spark-class runs $JAVA_HOME/bin/java when JAVA_HOME is set, whatever PATH holds
    assert java_missing({"JAVA_HOME": str(tmp_path), "PATH": str(tmp_path / "jdk" / "bin")}) == \
        f"JAVA_HOME={tmp_path} has no bin/java"


def test_no_java_is_one_line_naming_the_host_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SparkInstallError) as refused:
        check_java({"PATH": str(tmp_path)}, host="w1")
    message = str(refused.value)
    assert message.startswith("host w1: no Java for spark-submit (JAVA_HOME is not set and no java on PATH): "
                              "install Java 17 on this host"), message
    assert "\n" not in message and refused.value.reason == "java_missing"


def test_the_operator_refuses_a_host_without_java_before_spark_submit(nats_server, tmp_path: Path,
                                                                     monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NATS_DEFAULT", nats_conn_json(nats_server.url))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{tmp_path}")  # spark-submit, no java
    operator = JetStreamSparkSubmitOperator(task_id="write", application=str(tmp_path / "app.py"))
    with pytest.raises(SparkInstallError, match=r"^host \S+: no Java for spark-submit \(JAVA_HOME is not set"):
        operator.execute(context={})
