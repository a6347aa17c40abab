"""The ``@task.pyspark`` example DAG (``jetstream_pyspark_task``) runs end to end with ``airflow dags test``.

The ``nats`` connection (``AIRFLOW_CONN_*``) points at a real nats-server that requires a user and
password; ``spark_default`` is either of type ``spark`` (``local[2]``) or of type ``spark_connect``
(a real Spark Connect server on 127.0.0.1). Either way Spark's Python workers cannot import
``airflow_jetstream`` or nats-py unless they come from the shipped zip (``ship_package=True``).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_jetstream.client import ConnectionSettings, open_connection, stream_info
from airflow_jetstream.client.reading.stored import read_range
from tests.conftest import AUTH_PASSWORD, AUTH_USER
from tests.infra.spark_connect import EmbeddedSparkConnectServer
from tests.support.airflow_cli import dag_test_env, nats_conn_json, run_airflow
from tests.support.bare_python import make_bare_python
from tests.support.nats_calls import stored_rows
from tests.support.spark_connect import bare_connect_server

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.spark, pytest.mark.airflow_cli]

EXAMPLE = Path(__file__).resolve().parents[1] / "dags_examples" / "pyspark_task_dag.py"
DAG_ID, STREAM, ROWS = "jetstream_pyspark_task", "PYSPARK_ORDERS", 200


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedSparkConnectServer]:
    with bare_connect_server(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server


def spark_connection(kind: str, request: pytest.FixtureRequest) -> dict:
    """``spark_default`` of type ``spark`` (local[2]) or ``spark_connect`` (the module's Connect server)."""
    if kind == "spark":
        return {"conn_type": "spark", "host": "local[2]"}
    server: EmbeddedSparkConnectServer = request.getfixturevalue("connect_server")
    return {"conn_type": "spark_connect", "host": "127.0.0.1", "port": server.port}


def returned_xcom(home: Path, task_id: str) -> tuple[str, dict]:
    """The run id and the task's returned XCom (the one run ``airflow dags test`` made)."""
    with sqlite3.connect(home / "airflow.db") as db:
        run_id, value = db.execute("SELECT run_id, value FROM xcom WHERE dag_id = ? AND task_id = ? "
                                   "AND key = 'return_value'", (DAG_ID, task_id)).fetchone()
    return run_id, json.loads(value)


def order_ids_in_stream(settings: ConnectionSettings) -> tuple[int, list[int]]:
    async def read() -> tuple[int, list[int]]:
        async with open_connection(settings) as conn:
            last = (await stream_info(conn, STREAM))["state"]["last_seq"]
            messages = await stored_rows(conn, STREAM)  # the rows, not the chunks' write fences
            ids: list[int] = []
            async for chunk in read_range(conn, STREAM, 1, last):
                ids.extend(json.loads(bytes(m[4]))["order_id"] for m in chunk)
            return messages, ids

    return asyncio.run(read())


@pytest.mark.parametrize("spark_kind", ["spark", "spark_connect"])
def test_pyspark_task_example_dag_runs_end_to_end(spark_kind, user_server, tmp_path, request) -> None:
    home = tmp_path / "airflow"
    env = dag_test_env(
        home, user_server.url, {EXAMPLE.name: EXAMPLE.read_text()},
        AIRFLOW_CONN_NATS_SECURE=nats_conn_json(user_server.url, login=AUTH_USER, password=AUTH_PASSWORD,
                                                extra={"connect_timeout": 2}),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps(spark_connection(spark_kind, request)),
        PYSPARK_PYTHON=str(make_bare_python(tmp_path / "bare-python")),
    )
    run = run_airflow(["dags", "test", DAG_ID, "-c", json.dumps({"nats_conn_id": "nats_secure", "rows": ROWS})], env)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]

    run_id, returned = returned_xcom(home, "write_and_read")
    assert returned == {"rows_written": ROWS, "rows_stored": ROWS, "messages_in_stream": ROWS, "orders_in_stream": ROWS}
    # in the task log whatever the session kind (over Connect the write's own lines are in the server's log)
    assert f"{ROWS} rows written, {ROWS} stored now" in output, output[-6000:]
    settings = ConnectionSettings(servers=user_server.url, user=AUTH_USER, password=AUTH_PASSWORD, connect_timeout=2)
    messages, ids = order_ids_in_stream(settings)
    assert messages == ROWS and sorted(ids) == list(range(ROWS))  # every order exactly once

    logs = [output] + [p.read_text(errors="replace") for p in home.rglob("*.log")]
    if spark_kind == "spark_connect":
        server_files = request.getfixturevalue("connect_server").base_dir.parent.rglob("*")  # log, event log
        logs += [p.read_text(errors="replace") for p in server_files if p.is_file()]
    assert "shipped import: airflow_jetstream from " in "\n".join(logs)  # the workers used the shipped zip
    assert [log[:200] for log in logs if AUTH_PASSWORD in log] == []

    if spark_kind == "spark_connect":  # the task run again in the same DAG run (cleared, retried): nothing twice
        again = run_airflow(["tasks", "test", DAG_ID, "write_and_read", run_id], env)
        output = again.stdout + again.stderr
        assert again.returncode == 0, output[-6000:]
        assert f"{ROWS} rows written, 0 stored now" in output, output[-6000:]
        messages, ids = order_ids_in_stream(settings)
        assert messages == ROWS and sorted(ids) == list(range(ROWS))
        assert AUTH_PASSWORD not in output


def test_the_task_renders_for_a_run_without_a_logical_date() -> None:
    """A run triggered through the API (``logical_date: null``) has no ``ts``/``ts_nodash`` in its template
    context: the job id must come from the run id, not from the logical date."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(EXAMPLE)).dags[DAG_ID]
    task = dag.get_task("write_and_read")
    context = {"dag": dag, "task": task, "run_id": "manual__2026-01-01T00:00:00+00:00", "params": dag.params.validate()}
    task.render_template_fields(context)
    assert (tuple(task.op_args), task.op_kwargs) == (("nats_default", "1000"), {})
