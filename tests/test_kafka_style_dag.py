"""The Kafka-style example DAG runs end to end with `airflow dags test` against a real nats-server:
produce from a function, await a message, consume with a function, write and await a KV key."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from airflow_jetstream.client.admin.consumers import consumer_status
from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.kv import get_key
from airflow_jetstream.client.settings import ConnectionSettings
from tests.support.airflow_cli import dag_test_env, run_airflow

pytestmark = pytest.mark.airflow_cli
EXAMPLE = Path(__file__).resolve().parents[1] / "dags_examples" / "kafka_style_dag.py"


def test_kafka_style_example_dag_runs_end_to_end(nats_server, tmp_path) -> None:
    env = dag_test_env(tmp_path / "airflow", nats_server.url, {"kafka_style_dag.py": EXAMPLE.read_text()})
    run = run_airflow(["dags", "test", "kafka_style_orders", "-c", json.dumps({"orders": 12})], env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    async def state() -> tuple[dict, list[dict]]:
        settings = ConnectionSettings(servers=nats_server.url, connect_timeout=2, request_timeout=3)
        async with open_connection(settings) as conn:
            billing = await consumer_status(conn, "EVENTS_ORDERS", "events_billing")
            keys = await conn.js.key_value("KV_pipeline")
            entries = [await get_key(conn, "KV_pipeline", key) for key in await keys.keys()]
            return billing, entries

    billing, entries = asyncio.run(state())
    assert billing["ack_floor"]["stream_seq"] == 12 and billing["drained"]
    assert [entry["json"] for entry in entries] == [{"billed": 12}]
