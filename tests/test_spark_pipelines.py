"""Spark Declarative Pipelines (pyspark's ``spark-pipelines``) with the jetstream source, and the CLI's exit status.

One pipeline: a materialized view fed by the jetstream source (the CLI's own local Connect server,
whose Python has the package), run by ``spark-pipelines run``. The run completes and the view
holds the stream's messages, but pyspark's CLI then fails with
``[UNKNOWN_RESPONSE] Unknown response: Plan observed(__python_accumulator__=...)`` and exits 1: its
Connect client does not expect the Python workers' accumulator updates in a pipeline's event stream
(``execute_command_as_iterator``). The exit-status check fails as soon as a pyspark release exits 0,
so docs/spark.md ("Declarative Pipelines") and this test get updated then.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_jetstream.client import ConnectionSettings, ensure_stream
from tests.support.nats_calls import call_on_server

pytest.importorskip("pyspark")
import pyarrow.parquet as pq

MESSAGES = 20
#: spark-pipelines starts its Connect server and always connects its client to sc://localhost:15002.
CLI_PORT = 15002

PIPELINE = '''
import os

from pyspark import pipelines as dp

from airflow_jetstream.client import ConnectionSettings
from airflow_jetstream.spark import register

register(spark, ConnectionSettings(servers=os.environ["PIPELINE_NATS_URL"]))


@dp.materialized_view
def orders_snapshot():
    return spark.read.format("jetstream").options(stream="SDP", decode="utf-8").load()
'''


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _rows(table: Path) -> int:
    return sum(pq.read_metadata(part).num_rows for part in table.glob("*.parquet"))


def test_a_pipeline_fed_by_the_jetstream_source_completes_but_the_cli_exits_1(nats_server, tmp_path) -> None:
    if not _port_free(CLI_PORT):
        pytest.skip(f"port {CLI_PORT} is in use: spark-pipelines' client always connects to sc://localhost:{CLI_PORT}")
    settings = ConnectionSettings(servers=nats_server.url)

    async def fill(conn) -> None:
        await ensure_stream(conn, {"name": "SDP", "subjects": ["sdp.>"]})
        for index in range(MESSAGES):
            await conn.js.publish(f"sdp.{index % 2}", str(index).encode())

    call_on_server(settings, fill)
    project = tmp_path / "pipeline"
    (project / "transformations").mkdir(parents=True)
    (project / "spark-pipeline.yml").write_text(textwrap.dedent(f"""\
        name: jetstream_orders
        storage: file://{project / "storage"}
        libraries:
          - glob:
              include: transformations/**
        """))
    (project / "transformations" / "orders.py").write_text(PIPELINE)
    env = {**os.environ, "PIPELINE_NATS_URL": nats_server.url, "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    cli = Path(sys.executable).parent / "spark-pipelines"
    run = subprocess.run([str(cli), "run", "--spec", "spark-pipeline.yml",
                          "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", "spark.ui.enabled=false"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False)
    output = run.stdout + run.stderr
    assert "Run is COMPLETED." in output, output[-3000:]
    warehouse = project / "spark-warehouse"
    assert _rows(warehouse / "orders_snapshot") == MESSAGES
    if run.returncode == 0:
        pytest.fail("spark-pipelines now exits 0 with a Python data source in the pipeline: the pyspark defect is "
                    "fixed; update docs/spark.md (Declarative Pipelines) and this test")
    assert run.returncode == 1
    assert "[UNKNOWN_RESPONSE] Unknown response: Plan observed(__python_accumulator__=" in output
