"""The batch ledger sensor in real DAG runs (`airflow dags test`): templated run id, XCom result, and a
deferred wait whose trigger reaps a dead consumer's batch into a reported dead letter."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.airflow_cli import dag_test_env, run_airflow

pytestmark = pytest.mark.airflow_cli

DAGS = '''
import asyncio

import pendulum
from airflow.sdk import DAG, task

from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.sensors.ledger import JetStreamBatchLedgerSensor


def ledger_do(scenario, **kwargs):
    async def call(conn):
        return await scenario(await BatchLedger.open(conn, **kwargs))
    return JetStreamHook().run(call)


@task
def produce(suffix: str = "", run_id=None):
    async def scenario(ledger):
        for i in range(3):
            await ledger.record(run_id + suffix, f"b{i}", stream="ORDERS", count=100, first_seq=100 * i + 1,
                                last_seq=100 * i + 100)
    ledger_do(scenario)
    return 3


@task
def consume(suffix: str = "", dead_batch: str | None = None, run_id=None):
    async def scenario(ledger):
        for claim in await ledger.claim_available(run_id + suffix, owner="consume-task"):
            if claim.batch_id != dead_batch:
                await ledger.mark_consumed(claim)   # the dead batch is claimed, then never marked
    ledger_do(scenario, visibility_timeout=1, max_attempts=1)


@task
def report(summary: dict):
    print("LEDGER_REPORT " + ",".join(f"{k}={v}" for k, v in sorted(summary["states"].items())))


with DAG("ledger_sensor_e2e", start_date=pendulum.datetime(2026, 1, 1), schedule=None):
    batches = produce()
    waited = JetStreamBatchLedgerSensor(task_id="all_consumed", min_batches=batches, deferrable=True,
                                        poke_interval=0.2, timeout=60)
    batches >> consume() >> waited
    reported = report(waited.output)

    dead_batches = produce.override(task_id="produce_dead")(suffix="-dead")
    dead_waited = JetStreamBatchLedgerSensor(task_id="dead_letter_reported", run_id="{{ run_id }}-dead",
                                             min_batches=dead_batches, reap_expired=True, deferrable=True,
                                             poke_interval=0.2, timeout=60)
    reported >> dead_batches >> consume.override(task_id="consume_dies")(suffix="-dead", dead_batch="b1") >> dead_waited
'''


@pytest.fixture
def dag_env(tmp_path: Path, nats_server) -> dict[str, str]:
    return dag_test_env(tmp_path / "airflow", nats_server.url, {"ledger_dags.py": DAGS})


def test_sensor_in_a_dag_run_succeeds_and_reports_a_dead_letter(dag_env):
    run = run_airflow(["dags", "test", "ledger_sensor_e2e"], dag_env)
    output = run.stdout + run.stderr
    assert "LEDGER_REPORT consumed=3,failed=0,in_progress=0,published=0" in output, output[-4000:]
    assert "3/3 batch(es) reached consumed" in output
    # the dead-letter branch: its first poke sees b1 still claimed and defers; the trigger reaps it
    assert "Deferring" in output, output[-4000:]
    assert "1 batch(es) failed after their max attempts (b1)" in output, output[-4000:]
    assert "reason: batches_failed" in output
    assert run.returncode != 0  # the run fails on the dead letter: never silently dropped
