"""The traps issue 17 found by following the docs: each one refused, or measured and documented."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from airflow_jetstream.client import ensure_stream, stream_info
from airflow_jetstream.client.errors import StreamConfigError, StreamNotFoundError
from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator
from airflow_jetstream.sensors.consumer import JetStreamSourceCaughtUpSensor
from tests.support.nats_calls import call_on_server as run
from tests.support.polling import wait_until


@pytest.mark.parametrize(("first_mode", "second_mode"), [("user", "server"), ("server", "user")])
def test_second_durable_source_on_a_workqueue_origin_is_refused_naming_the_first(first_mode, second_mode, nats_conn,
                                                                                 settings):
    run(settings, ensure_stream, {"name": "ORIG", "subjects": ["orig.>"], "retention": "workqueue"})
    first = JetStreamDurableSourceOperator(
        task_id="a", stream="AGG", source="ORIG",
        user_managed={"consumer": "AGG_SRC", "deliver_subject": "_SRC.AGG"} if first_mode == "user" else None)
    fed = first.execute(context={})
    assert first.execute(context={})["action"] == "unchanged"  # a re-run of the same source is not "a second"
    second = JetStreamDurableSourceOperator(
        task_id="b", stream="AGG2", source="ORIG",
        user_managed={"consumer": "AGG2_SRC", "deliver_subject": "_SRC.AGG2"} if second_mode == "user" else None)
    with pytest.raises(StreamConfigError) as refused:
        second.execute(context={})
    assert refused.value.reason == "origin_already_sourced"
    assert fed["consumer"] in str(refused.value) and "allow_shared_origin" in str(refused.value)
    with pytest.raises(StreamNotFoundError):
        run(settings, stream_info, "AGG2")  # nothing was created for the refused source


def test_shared_workqueue_origin_with_the_opt_in_feeds_both(nats_conn, settings):
    run(settings, ensure_stream, {"name": "ORIG", "subjects": ["orig.>"], "retention": "workqueue"})
    JetStreamDurableSourceOperator(task_id="a", stream="AGG", source="ORIG").execute(context={})
    shared = JetStreamDurableSourceOperator(task_id="b", stream="AGG2", source="ORIG", allow_shared_origin=True,
                                            user_managed={"consumer": "AGG2_SRC", "deliver_subject": "_SRC.AGG2"})
    assert shared.execute(context={})["action"] == "created"


def test_caught_up_means_nothing_in_flight_either(nats_conn, settings):
    """Caught up = the origin's consumer has nothing pending AND nothing awaiting the aggregate's
    confirmation: at that moment a WorkQueue origin is empty and the aggregate holds everything."""
    run(settings, ensure_stream, {"name": "ORIG", "subjects": ["orig.>"], "retention": "workqueue"})
    JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIG").execute(context={})

    async def publish(conn):
        for i in range(20):
            await conn.js.publish(f"orig.{i}", b"x")

    run(settings, publish)
    sensor = JetStreamSourceCaughtUpSensor(task_id="caught_up", stream="AGG", source="ORIG", poke_interval=0.05,
                                           timeout=60, deferrable=False)
    status = sensor.execute(context={})
    origin, aggregate = (run(settings, stream_info, name)["state"]["messages"] for name in ("ORIG", "AGG"))
    assert status["caught_up"] and status["consumer_num_pending"] == 0 and status["consumer_num_ack_pending"] == 0
    assert (origin, aggregate) == (0, 20)


WAITING_DAGS = '''
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_jetstream.sensors.kv import JetStreamKeyValueSensor
from airflow_jetstream.sensors.ledger import JetStreamBatchLedgerSensor
from airflow_jetstream.sensors.message import JetStreamMessageSensor

with DAG(dag_id="never_true", start_date=datetime(2026, 1, 1), schedule=None):
    JetStreamBatchLedgerSensor(task_id="ledger", deferrable=True, poke_interval=2, timeout=6)
    JetStreamKeyValueSensor(task_id="kv", bucket="models", key="churn", value="ready", deferrable=True, timeout=6)
    JetStreamMessageSensor(task_id="message", stream="EVENTS", apply_function="builtins.bool", deferrable=True,
                           timeout=6)

with DAG(dag_id="long_wait", start_date=datetime(2026, 1, 1), schedule=None):
    JetStreamBatchLedgerSensor(task_id="ledger", deferrable=True, poke_interval=2, timeout=3600)

with DAG(dag_id="execution_timeout", start_date=datetime(2026, 1, 1), schedule=None):
    JetStreamMessageSensor(task_id="message", stream="EVENTS", apply_function="builtins.bool", deferrable=False,
                           poke_interval=0.5, timeout=3600, execution_timeout=timedelta(seconds=3), retries=1,
                           retry_delay=timedelta(seconds=0))
'''


@pytest.fixture(scope="module")
def waiting_env(tmp_path_factory):
    """An Airflow home with the DAGs above, nats_default on a server with the stream and bucket they watch."""
    from airflow_jetstream.client import ConnectionSettings
    from airflow_jetstream.client.kv.bucket import ensure_bucket
    from airflow_jetstream.embedded import EmbeddedNatsServer
    from tests.support.airflow_cli import dag_test_env

    home = tmp_path_factory.mktemp("waiting")
    with EmbeddedNatsServer(store_dir=home / "nats") as server:
        settings = ConnectionSettings(servers=server.url, connect_timeout=2)
        run(settings, ensure_stream, {"name": "EVENTS", "subjects": ["events.>"]})
        run(settings, ensure_bucket, "models")
        yield dag_test_env(home / "airflow", server.url, {"waiting.py": WAITING_DAGS})


def _dags_test(dag_id: str, env: dict, out: Path) -> subprocess.Popen:
    from tests.support.airflow_cli import AIRFLOW

    return subprocess.Popen([AIRFLOW, "dags", "test", dag_id], env=env, stdout=out.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float, out: Path) -> int:
    """The exit code, or fail (after SIGKILL of what this test started) when it does not exit in time."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"airflow dags test still running after {timeout}s:\n{out.read_text()[-3000:]}") from None


def _run_to_the_end(dag_id: str, env: dict, tmp_path: Path) -> tuple[int, str]:
    """``airflow dags test dag_id``: its exit code and output."""
    out = tmp_path / "dags-test.log"
    code = _finish(_dags_test(dag_id, env, out), 240, out)
    return code, out.read_text()


@pytest.mark.airflow_cli
def test_deferred_sensors_time_out_under_airflow_dags_test(waiting_env, tmp_path):
    """dags test runs triggers inline and ignores the deferral timeout: each trigger ends at its own."""
    code, log = _run_to_the_end("never_true", waiting_env, tmp_path)
    assert code != 0 and "DagRun failed" in log
    assert "batch ledger not reached within 6 s" in log
    kv_timeout = "KV models/churn to equal 'ready' not reached within 6 s. Last seen: KV models/churn equals 'ready': "
    assert kv_timeout + "not yet" in log and "no message of stream EVENTS matched within 6 s" in log
    assert log.count("[DAG TEST] Trigger completed") == 3
    assert "coroutine ignored GeneratorExit" not in log


@pytest.mark.airflow_cli
def test_sigterm_stops_a_deferred_sensor_under_airflow_dags_test(waiting_env, tmp_path):
    out = tmp_path / "dags-test.log"
    proc = _dags_test("long_wait", waiting_env, out)
    try:
        wait_until(lambda: "Waiting for batch ledger" in out.read_text() or proc.poll() is not None,
                   "the inline trigger to start waiting", timeout=180, every=0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    code = _finish(proc, 60, out)
    assert code != 0 and "received SIGTERM while waiting" in out.read_text()


@pytest.mark.airflow_cli
def test_execution_timeout_of_a_poke_sensor_stays_a_timeout_and_is_retried(waiting_env, tmp_path):
    """Airflow calls on_kill() while it handles execution_timeout: that must not turn into 'received SIGTERM'."""
    code, log = _run_to_the_end("execution_timeout", waiting_env, tmp_path)
    assert code != 0 and "DagRun failed" in log
    assert "received SIGTERM" not in log and "AirflowTaskTerminated" not in log
    assert "new_state=up_for_retry" in log  # the first try timed out and was retried (retries=1)
    assert log.count("AirflowTaskTimeout: Timeout") == 2  # both tries ended as timeouts
