"""A task running ``JetStreamSparkSubmitOperator`` killed with SIGKILL leaves no Spark process and no copy of the
connection's password behind.

The task is a real Airflow task (``airflow tasks test``) submitting a job to ``local[2]`` that writes to a real
nats-server with a password. Once the job's rows arrive in the stream, the process that started spark-submit is
killed with SIGKILL: nothing of the operator's runs after that (no ``finally``, no ``on_kill``). Before the fix
spark-submit was re-parented to init and kept writing, and its properties file with the password stayed in the
temp directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection, stream_info
from tests.conftest import AUTH_PASSWORD, AUTH_USER
from tests.support.airflow_cli import AIRFLOW, dag_test_env, nats_conn_json
from tests.support.polling import wait_for, wait_until

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.spark, pytest.mark.airflow_cli]

STREAM, SUBJECT = "ORPHANS", "orphans.rows"

#: A job that writes rows until it is stopped.
WRITE_FOREVER = f"""
from pyspark.sql import SparkSession
from airflow_jetstream.spark import register

spark = SparkSession.builder.getOrCreate()
register(spark)
for round in range(1_000_000):
    spark.range(round * 100, (round + 1) * 100).selectExpr("CAST(id AS STRING) AS payload") \\
        .write.format("jetstream").mode("append").option("stream", "{STREAM}").option("subject", "{SUBJECT}").save()
"""

DAG_FILE = """
import pendulum
from airflow.sdk import DAG
from airflow_jetstream.operators.spark_submit import JetStreamSparkSubmitOperator

with DAG("spark_orphans", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
    JetStreamSparkSubmitOperator(task_id="write", application={app!r}, nats_conn_id="nats_secure",
                                 conf={{"spark.ui.enabled": "false"}})
"""


def stored(settings: ConnectionSettings) -> int:
    async def count() -> int:
        async with open_connection(settings) as conn:
            return int((await stream_info(conn, STREAM))["state"]["messages"])

    return asyncio.run(count())


def spark_submit_of(task: psutil.Process) -> psutil.Process | None:
    """The spark-submit JVM among ``task``'s descendants (it runs org.apache.spark.deploy.SparkSubmit)."""
    for child in task.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if "org.apache.spark.deploy.SparkSubmit" in child.cmdline():
                return child
    return None


def running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_killed_task_leaves_no_spark_process_and_no_properties_file(user_server, tmp_path: Path) -> None:
    settings = ConnectionSettings(servers=user_server.url, user=AUTH_USER, password=AUTH_PASSWORD)

    async def make_stream() -> None:
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": STREAM, "subjects": [SUBJECT], "allow_atomic": True})

    asyncio.run(make_stream())
    app = tmp_path / "write_forever.py"
    app.write_text(WRITE_FOREVER)
    temp = tmp_path / "task-tmp"  # the task's temp directory: where the operator writes what it hands the job
    temp.mkdir()
    env = dag_test_env(
        tmp_path / "airflow", user_server.url, {"spark_orphans.py": DAG_FILE.format(app=str(app))},
        AIRFLOW_CONN_NATS_SECURE=nats_conn_json(user_server.url, login=AUTH_USER, password=AUTH_PASSWORD),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        TMPDIR=str(temp), PYSPARK_PYTHON=sys.executable,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # spark-submit
    )
    log = tmp_path / "task.log"
    with log.open("wb") as out:
        cli = subprocess.Popen([AIRFLOW, "tasks", "test", "spark_orphans", "write"], env=env, start_new_session=True,
                               stdout=out, stderr=subprocess.STDOUT)

    def alive() -> None:
        assert cli.poll() is None, f"the task ended: {log.read_text(errors='replace')[-4000:]}"

    def started() -> psutil.Process | None:
        alive()
        return spark_submit_of(psutil.Process(cli.pid))

    def writing() -> bool:
        alive()
        return stored(settings) > 0

    try:
        submit = wait_for(started, "spark-submit to start", 180)
        wait_for(writing, "the job's first rows in the stream", 180)
        task = submit.parent()
        spark = [submit, *submit.children(recursive=True)]  # the JVM, the Python driver, pyspark's daemon, workers
        assert task is not None
        task.send_signal(signal.SIGKILL)
        wait_until(lambda: not [p for p in spark if running(p)],
                   "every Spark process of the killed task to end", timeout=60)
        left = [path for path in temp.rglob("*") if path.is_file() and AUTH_PASSWORD.encode() in path.read_bytes()]
        assert left == [], f"the password is left on disk in {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cli.pid, signal.SIGKILL)  # what is left of the session (orphans keep its process group)
        cli.wait(60)
