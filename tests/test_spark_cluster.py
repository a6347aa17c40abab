"""The orders pipeline on a Spark standalone cluster against a NATS server that requires a password.

One ``airflow dags test`` run of ``jetstream_orders_pipeline`` (as ``make demo-cluster`` runs it):
Spark master + 2 workers from pyspark's distribution, jobs submitted to ``spark://`` in client mode,
the credentials only in the ``nats_default`` connection. Executors run a Python that cannot import
``airflow_jetstream``, nats-py or Airflow from the project venv (a ``sitecustomize`` refuses them
unless they come from a ``--py-files`` zip), so the run also proves the shipped package. Then every
log and rendered template of the run is scanned for the password. On the same cluster, a job re-run after
its chunks were committed but never recorded stores no row twice (the write fence).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.infra.spark_cluster import EmbeddedSparkCluster
from tests.support.bare_python import make_bare_python
from tests.support.nats_calls import (
    all_messages,
    call_on_server,
    drop_bucket,
    ledger_ranges,
    publish_until_window_passed,
    stored_rows,
)
from tests.support.polling import wait_until

ROOT = Path(__file__).resolve().parents[1]
ROWS = 2000
PASSWORD = f"pw-{secrets.token_hex(12)}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The password-protected NATS server and the standalone cluster every test of the module runs on."""
    home = tmp_path_factory.mktemp("cluster-run")
    executor_python = make_bare_python(home / "bare-python")
    users = {"authorization": {"users": [{"user": "airflow", "password": PASSWORD}]}}
    with EmbeddedNatsServer(store_dir=home / "nats", config=users) as nats, \
            EmbeddedSparkCluster(workers=2, base_dir=home / "spark") as spark_cluster:
        yield {"home": home, "nats": nats, "spark": spark_cluster, "executor_python": executor_python}


def completed_apps(spark: EmbeddedSparkCluster, count: int, named: Callable[[str], bool]) -> list[dict]:
    """The master's completed applications whose name ``named`` accepts, once it lists ``count`` of them (bounded).

    A driver tells the master it has ended with a one-way message (Spark's StandaloneAppClient sends
    UnregisterApplication, it does not ask), so spark-submit can exit before the master has moved its application
    to the completed ones: a status read right after the job returned may not list it yet."""
    apps: list[dict] = []

    def listed() -> bool:
        apps[:] = [app for app in spark.status()["completedapps"] if named(app["name"])]
        return len(apps) >= count

    wait_until(listed, f"the Spark master to list {count} completed application(s)", timeout=60, every=0.2)
    return apps


@pytest.fixture(scope="module")
def run(cluster: dict) -> dict:
    sys.path.insert(0, str(ROOT / "dags_examples"))
    from run_demo import nats_connection, run_pipeline

    home: Path = cluster["home"]
    wrappers = home / "bin"
    wrappers.mkdir()
    argv_log = home / "spark-submit-argv.txt"
    spark_submit = wrappers / "spark-submit"
    spark_submit.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{argv_log}"\n'
                            f'exec "{Path(sys.executable).parent / "spark-submit"}" "$@"\n')
    spark_submit.chmod(0o755)
    conf_dir, event_dir = home / "spark-conf", home / "spark-events"
    conf_dir.mkdir()
    event_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir file://{event_dir}\nspark.eventLog.compress false\n"
        "spark.eventLog.rolling.enabled false\nspark.executor.memory 512m\n")
    conn = nats_connection(cluster["nats"].url, login="airflow", password=PASSWORD)
    extra_env = {
        "PYSPARK_PYTHON": str(cluster["executor_python"]),
        "SPARK_CONF_DIR": str(conf_dir),
        "PATH": f"{wrappers}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    summary = run_pipeline(home, conn, spark_master=cluster["spark"].master_url, conf={"rows": ROWS},
                           extra_env=extra_env, log=lambda _msg: None)
    apps = completed_apps(cluster["spark"], 2, lambda name: "-orders" in name)
    return {"summary": summary, "home": home, "apps": apps, "argv": argv_log.read_text(),
            "task_log": (home / "jetstream_orders_pipeline.log").read_text(), "events": event_dir,
            "executor_logs": sorted((home / "spark").glob("worker-*/app-*/*/std*"))}


def test_pipeline_runs_on_the_standalone_cluster_with_the_password_only_in_the_connection(run) -> None:
    summary = run["summary"]
    assert summary["rows_produced"] == ROWS and summary["messages_in_aggregate"] == ROWS
    assert summary["rows_consumed"] == ROWS and summary["distinct_orders"] == ROWS
    assert summary["batches_by_state"] == {"consumed": summary["batches"]}
    assert sorted(app["name"].split("-orders")[0] for app in run["apps"]) == ["consume", "produce"]
    assert all(app["state"] == "FINISHED" for app in run["apps"])
    # each executor its own JVM on its own worker: one stderr per (worker, app, executor)
    executor_dirs = {p.parent for p in run["executor_logs"]}
    assert len({d.parts[-3] for d in executor_dirs}) == 2 and len(executor_dirs) >= 4


def test_executors_import_the_shipped_package_not_an_installed_one(run) -> None:
    stderr = "\n".join(p.read_text(errors="replace") for p in run["executor_logs"] if p.name == "stderr")
    assert "shipped import: airflow_jetstream from " in stderr
    assert "airflow_jetstream_spark.zip/airflow_jetstream/__init__.py" in stderr
    assert "shipped import: nats from " in stderr
    assert "ModuleNotFoundError" not in stderr


def test_progress_lines_reach_the_task_log(run) -> None:
    log = run["task_log"]
    assert "jetstream: write ORDERS_RAW job orders-" in log and f"committed: {ROWS} of {ROWS} rows stored" in log
    assert f"jetstream: consume ORDERS_AGG: read {ROWS} message(s)" in log


def test_the_password_is_in_no_command_line_log_event_log_or_rendered_template(run) -> None:
    home: Path = run["home"]
    argv = run["argv"]
    assert "--properties-file" in argv and "--py-files" in argv  # what `ps` shows of spark-submit
    assert "spark.jetstream" not in argv and PASSWORD not in argv
    events = [p for p in run["events"].rglob("app-*") if p.is_file()]  # uncompressed JSON lines
    event_text = "\n".join(p.read_text(errors="replace") for p in events)
    assert len(events) >= 2 and '"spark.jetstream.secret.password":"*********(redacted)"' in event_text
    with sqlite3.connect(home / "airflow" / "airflow.db") as db:
        rendered = [row[0] for row in db.execute("select rendered_fields from rendered_task_instance_fields")]
    assert any("produce_orders.py" in r for r in rendered)
    scanned = {"spark-submit argv": argv, "event logs": event_text, "rendered templates": "\n".join(rendered),
               "task log": run["task_log"]}
    for path in [*home.rglob("*.log"), *run["executor_logs"], *(home / "airflow" / "logs").rglob("*")]:
        if path.is_file():
            scanned[str(path.relative_to(home))] = path.read_text(errors="replace")
    assert len(scanned) > 8
    leaks = sorted(name for name, text in scanned.items() if PASSWORD in text)
    assert leaks == []
    assert json.dumps(run["summary"]).find(PASSWORD) == -1


# A job whose executors (bare Python, the package shipped by register) write ``rows`` ids to FENCED.
FENCED_JOB = """
import os, sys
from pyspark.sql import SparkSession, functions as F
from airflow_jetstream.client import ConnectionSettings
from airflow_jetstream.spark import register

servers, job_id, rows = sys.argv[1:]
spark = SparkSession.builder.appName("fenced-" + job_id).getOrCreate()
register(spark, ConnectionSettings(servers=servers, user="airflow", password=os.environ["FENCED_NATS_PASSWORD"]),
         ship_package=True)
frame = spark.range(0, int(rows), numPartitions=4).select(F.lit("fenced.rows").alias("subject"),
                                                          F.col("id").cast("string").alias("payload"))
frame.write.format("jetstream").mode("append").options(
    stream="FENCED", job_id=job_id, batch_size="250", ledger_bucket="LEDGER_FENCED").save()
spark.stop()
"""


def test_chunks_committed_on_the_workers_but_never_recorded_are_not_stored_again_after_the_window(
        cluster: dict, tmp_path: Path) -> None:
    """The executors on the standalone workers commit every chunk and none is recorded (what tasks killed
    between the commit and the ledger entry leave); the same job_id re-run after the duplicate window
    stores no row again (each chunk's fence refuses it) and the ledger keeps the sequences first committed."""
    rows = 2000
    settings = ConnectionSettings(servers=cluster["nats"].url, user="airflow", password=PASSWORD, request_timeout=10)
    call_on_server(settings, ensure_stream, {"name": "FENCED", "subjects": ["fenced.>"], "allow_atomic": True,
                                             "duplicate_window": "1s"})
    script = tmp_path / "fenced_job.py"
    script.write_text(FENCED_JOB)
    env = {**os.environ, "PYSPARK_PYTHON": str(cluster["executor_python"]), "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "FENCED_NATS_PASSWORD": PASSWORD}
    submit = [str(Path(sys.executable).parent / "spark-submit"), "--master", cluster["spark"].master_url,
              "--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false",
              str(script), cluster["nats"].url, "fenced-1", str(rows)]

    def run_job() -> None:
        done = subprocess.run(submit, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    run_job()
    committed = call_on_server(settings, ledger_ranges, "LEDGER_FENCED", "fenced-1")
    assert sum(count for count, _first, _last in committed.values()) == rows
    call_on_server(settings, drop_bucket, "LEDGER_FENCED")  # the commits stay, their ledger entries are gone
    probes = call_on_server(settings, publish_until_window_passed, "fenced.probe")

    run_job()
    apps = completed_apps(cluster["spark"], 2, lambda name: name == "fenced-fenced-1")
    assert [app["state"] for app in apps] == ["FINISHED", "FINISHED"]
    ids = Counter(int(m[4]) for m in call_on_server(settings, all_messages, "FENCED") if m[0] == "fenced.rows")
    assert ids == Counter(range(rows))
    assert call_on_server(settings, stored_rows, "FENCED") == rows + probes
    assert call_on_server(settings, ledger_ranges, "LEDGER_FENCED", "fenced-1") == committed

