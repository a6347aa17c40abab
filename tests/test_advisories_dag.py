"""The advisory sensor in real DAG runs (`airflow dags test`), and the example event-driven DAG file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.airflow_cli import dag_test_env, run_airflow

EXAMPLES = Path(__file__).resolve().parents[1] / "dags_examples"

DAGS = '''
import pendulum
from airflow.sdk import DAG, task

from airflow_jetstream.client import ensure_stream
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.operators.advisory import JetStreamAdvisoryStreamOperator
from airflow_jetstream.sensors.advisory import JetStreamAdvisorySensor


@task
def create_stream(name: str) -> str:
    JetStreamHook().run(ensure_stream, {"name": name, "subjects": [name.lower() + ".>"]})
    return name


@task
def report(found: dict, quiet: dict):
    print(f"ADVISORY_REPORT kind={found['advisory_kind']} stream={found['stream']} quiet={quiet['advisory']}")


with DAG("advisory_e2e", start_date=pendulum.datetime(2026, 1, 1), schedule=None):
    capture = JetStreamAdvisoryStreamOperator(task_id="capture", max_age="1h")
    created = create_stream("ORDERS")
    found = JetStreamAdvisorySensor(task_id="found", advisory="stream_created", advisory_stream="ORDERS",
                                    start_time="{{ dag_run.start_date }}", deferrable=True, timeout=60)
    quiet = JetStreamAdvisorySensor(task_id="quiet", advisory="batch_abandoned", advisory_stream="ORDERS",
                                    start_time="{{ dag_run.start_date }}", expect="absent", quiet_period=1,
                                    deferrable=True, timeout=60)
    capture >> created >> [found, quiet]
    report(found.output, quiet.output)
    guard = JetStreamAdvisorySensor(task_id="guard", advisory="stream_created", advisory_stream="ORDERS",
                                    start_time="{{ dag_run.start_date }}", expect="absent", quiet_period=30,
                                    mode="reschedule", poke_interval=1, timeout=60)
    created >> guard
'''


@pytest.fixture
def dag_env(tmp_path: Path, nats_server) -> dict[str, str]:
    return dag_test_env(tmp_path / "airflow", nats_server.url, {"advisory_dags.py": DAGS})


@pytest.mark.airflow_cli
def test_sensor_in_dag_runs(dag_env):
    run = run_airflow(["dags", "test", "advisory_e2e"], dag_env)
    output = run.stdout + run.stderr
    # found at the first poke although the advisory was published by the task before it
    assert "ADVISORY_REPORT kind=stream_created stream=ORDERS quiet=None" in output, output[-4000:]
    assert "Deferring: waiting for batch_abandoned" in output, output[-4000:]  # the guard waited in the trigger
    # the guard on the same advisory fails the run, naming what it found
    assert "guard failed: advisory stream_created (stream=ORDERS)" in output, output[-4000:]
    assert run.returncode != 0


def test_example_event_driven_dag_loads_with_jetstream_watchers():
    code = textwrap.dedent(f"""
        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag(dag_folder={str(EXAMPLES / "event_driven_dag.py")!r})
        assert not bag.import_errors, bag.import_errors
        dag = bag.dags["process_ready_orders"]
        asset = dag.timetable.asset_condition.objects[0]
        classpath, kwargs = asset.watchers[0].trigger.serialize()
        print(sorted(bag.dag_ids), classpath, kwargs["stream"], kwargs["consumer"])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("['handle_abandoned_batches', 'process_ready_orders', 'publish_orders_guarded', 'publish_ready_orders'] "
            "airflow_jetstream.triggers.message.JetStreamMessageTrigger ORDERS_READY airflow_orders_ready"
            ) in out.stdout
