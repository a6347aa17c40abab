"""A host without Java fails the Spark task in one line naming the host and the fix
(airflow_jetstream/operators/spark_submit.py), before spark-submit starts: spark-class alone says "JAVA_HOME is not
set" inside the provider's "Cannot execute"."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_jetstream.client import ensure_stream
from airflow_jetstream.client.errors import SparkInstallError
from airflow_jetstream.operators.spark_submit import (
    JetStreamSparkSubmitOperator,
    check_driver_python,
    check_java,
    driver_python,
    java_missing,
)
from airflow_jetstream.spark.driver import cause_in
from tests.support.airflow_cli import nats_conn_json
from tests.support.nats_calls import call_on_server


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


def test_the_driver_python_is_the_one_spark_submit_picks() -> None:
    env = {"PYSPARK_DRIVER_PYTHON": "/env/driver", "PYSPARK_PYTHON": "/env/python"}
    conf = {"spark.pyspark.driver.python": "/conf/driver", "spark.pyspark.python": "/conf/python"}
    assert driver_python(conf, env) == ("/conf/driver", "spark.pyspark.driver.python")
    assert driver_python({"spark.pyspark.python": "/conf/python"}, env) == ("/conf/python", "spark.pyspark.python")
    assert driver_python({}, env) == ("/env/driver", "PYSPARK_DRIVER_PYTHON")
    assert driver_python({}, {"PYSPARK_PYTHON": "/env/python"}) == ("/env/python", "PYSPARK_PYTHON")
    assert driver_python({}, {}) == ("python3", "Spark's default")


def python_without_the_package() -> str:
    """A real Python of this one's minor version that cannot import airflow_jetstream (the venv's base)."""
    for python in (Path(sys.base_prefix) / "bin" / "python3", Path("/usr/bin/python3")):
        probe = subprocess.run([str(python), "-c", "import sys, importlib.util; print(sys.version_info[:2] == "
                                f"{tuple(sys.version_info[:2])} and not "
                                "importlib.util.find_spec('airflow_jetstream'))"],
                               capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"}, cwd="/")
        if probe.stdout.strip() == "True":
            return str(python)
    pytest.skip(f"no Python {sys.version_info[0]}.{sys.version_info[1]} without the package on this host")


def python_of_another_minor_version() -> str:
    """A real Python whose minor version is not this one's, or a skip saying there is none here."""
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    patterns = ("/usr/bin/python3.1[0-9]", "/usr/local/bin/python3.1[0-9]", "/root/.pyenv/versions/3.1*/bin/python3")
    for pattern in patterns:
        for python in sorted(glob.glob(pattern)):
            probe = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                   capture_output=True, text=True, check=False)
            if probe.returncode == 0 and probe.stdout.strip() not in (mine, "3.10"):
                return python
    pytest.skip(f"no Python 3.11+ other than {mine} on this host")


def test_a_driver_python_that_is_missing_old_or_without_the_package_is_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # not the checkout: a Python started there imports the package from it
    with pytest.raises(SparkInstallError) as missing:
        check_driver_python({"spark.pyspark.python": str(tmp_path / "python3.9")}, {}, needs_package=False, host="w1")
    assert str(missing.value) == (f"host w1: the Spark driver's Python '{tmp_path / 'python3.9'}' "
                                  "(spark.pyspark.python) does not run (No such file or directory): install it on "
                                  "this host or name one that is installed (reason: python_missing)")
    old = tmp_path / "python"
    old.write_text("#!/bin/sh\necho 3.9; echo True\n")  # what a Python 3.9 prints for the probe
    old.chmod(0o755)
    with pytest.raises(SparkInstallError) as too_old:
        check_driver_python({}, {"PYSPARK_PYTHON": str(old)}, needs_package=False, host="w1")
    assert too_old.value.reason == "python_mismatch" and "is Python 3.9; the package needs 3.11 or newer" in str(
        too_old.value)
    bare = python_without_the_package()
    with pytest.raises(SparkInstallError) as no_package:
        check_driver_python({}, {"PYSPARK_PYTHON": bare}, needs_package=True, host="w1")
    message = str(no_package.value)
    assert message.startswith(f"host w1: the Spark driver's Python '{bare}' (PYSPARK_PYTHON) (Python "), message
    assert "has no airflow_jetstream" in message and "ship_package=True" in message and "\n" not in message
    assert no_package.value.reason == "package_missing"
    assert check_driver_python({}, {"PYSPARK_PYTHON": bare}, needs_package=False) == \
        f"{sys.version_info[0]}.{sys.version_info[1]}", "shipped: the package comes with the job"
    assert check_driver_python({}, {"PYSPARK_PYTHON": sys.executable}, needs_package=True)


def _spark_env(monkeypatch, nats_server) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NATS_DEFAULT", nats_conn_json(nats_server.url))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def test_the_operator_refuses_a_driver_python_that_is_not_there(nats_server, tmp_path: Path, monkeypatch) -> None:
    _spark_env(monkeypatch, nats_server)
    monkeypatch.setenv("PYSPARK_PYTHON", str(tmp_path / "python3"))
    operator = JetStreamSparkSubmitOperator(task_id="write", application=str(tmp_path / "app.py"))
    with pytest.raises(SparkInstallError, match=r"^host \S+: the Spark driver's Python '.*python3' \(PYSPARK_PYTHON\) "
                                                r"does not run"):
        operator.execute(context={})


WRITE_TEN_ROWS = """
    from pyspark.sql import SparkSession
    from airflow_jetstream.spark import register

    spark = SparkSession.builder.getOrCreate()
    register(spark)
    spark.range(10).selectExpr("CAST(id AS STRING) AS payload").write.format("jetstream") \\
        .mode("append").option("stream", "HOSTCHECK").option("subject", "hostcheck.x").save()
"""


def submit_with_executor_python(nats_server, tmp_path: Path, monkeypatch, python: str) -> SparkInstallError:
    """Run a job whose driver is this Python and whose executors run ``python``; the error it ends the task with."""
    from airflow_jetstream.client import ConnectionSettings

    call_on_server(ConnectionSettings(servers=[nats_server.url]), ensure_stream,
                   {"name": "HOSTCHECK", "subjects": ["hostcheck.>"]})
    app = tmp_path / "write_ten_rows.py"
    app.write_text(textwrap.dedent(WRITE_TEN_ROWS))
    _spark_env(monkeypatch, nats_server)
    monkeypatch.chdir(tmp_path)  # not the checkout: Python workers start there and would import the package from it
    operator = JetStreamSparkSubmitOperator(task_id="write", application=str(app), conf={
        "spark.ui.enabled": "false", "spark.pyspark.driver.python": sys.executable, "spark.pyspark.python": python})
    with pytest.raises(SparkInstallError) as refused:
        operator.execute(context={})
    assert "\n" not in str(refused.value)
    return refused.value


@pytest.mark.spark
def test_an_executor_python_of_another_minor_version_is_named_with_its_host(nats_server, tmp_path: Path,
                                                                            monkeypatch) -> None:
    other = python_of_another_minor_version()
    refused = submit_with_executor_python(nats_server, tmp_path, monkeypatch, other)
    assert refused.reason == "python_mismatch"
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert str(refused).startswith("executor host "), refused
    assert f"and the driver's {mine} (PySpark runs one minor version on both): set spark.pyspark.python to a Python " \
           f"{mine} with pyspark on that host" in str(refused)


@pytest.mark.spark
def test_an_executor_python_without_the_package_is_named_with_its_host(nats_server, tmp_path: Path,
                                                                       monkeypatch) -> None:
    refused = submit_with_executor_python(nats_server, tmp_path, monkeypatch, python_without_the_package())
    assert refused.reason == "package_missing"
    assert str(refused).startswith("executor host ") and "its Python has no airflow_jetstream: pass " \
        "ship_package=True" in str(refused), refused


def test_spark_names_the_executor_host_in_both_forms_of_its_lost_task_line() -> None:
    mismatch = ("pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in worker has "
                "different version: 3.12 than that in driver: 3.11, PySpark cannot run with different minor versions.")
    for lost in ("WARN TaskSetManager: Lost task 0.0 in stage 0.0 (TID 0) (10.9.0.4 executor 1): org.apache.spark",
                 "INFO TaskSetManager: Lost task 1.0 in stage 0.0 (TID 1) on 10.9.0.4, executor 1: org.apache.spark"):
        assert cause_in(f"{mismatch}\n{lost}") == (
            "SparkInstallError: executor host 10.9.0.4: its Python is 3.12 and the driver's 3.11 (PySpark runs one "
            "minor version on both): set spark.pyspark.python to a Python 3.11 with pyspark on that host "
            "(reason: python_mismatch)")
