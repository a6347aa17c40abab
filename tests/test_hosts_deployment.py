"""Airflow on the CeleryExecutor across five hosts (network namespaces on this machine, ``make up-hosts``).

One deployment for the module (:class:`tests.infra.hosts_deployment.HostsDeployment`): PostgreSQL and Redis on
``db``; api-server, scheduler and dag-processor on ``ctl``; a Celery worker, a triggerer, a NATS node and a Spark
worker on each of ``w1`` and ``w2``; the third NATS node and the Spark master on ``edge``. It proves that each host
is its own (address, ``/tmp``, files; the code read-only; every server on its host's address), that the examples
run there (the orders pipeline's Spark jobs submitted in client mode from a worker host to the master on ``edge``,
the event-driven DAG from a watcher on a triggerer host, the hourly incremental DAG on its own schedule) and that
the JetStream view and the connection Test button answer from the api-server host.

Needs root and ``ip netns``; without them the module skips and says why.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_jetstream.client import ConnectionSettings, open_connection
from tests.infra.airflow_local import LocalAirflow
from tests.infra.hosts import REPO, namespaces_unavailable
from tests.infra.hosts_deployment import NATS_USER, WORKER_HOSTS, HostsDeployment
from tests.support.airflow_api import Api
from tests.support.kv_keys import kv_keys
from tests.support.polling import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

PIPELINE, INCREMENTAL, PUBLISH_READY, PROCESS_READY = (
    "jetstream_orders_pipeline", "jetstream_orders_incremental", "publish_ready_orders", "process_ready_orders")
ROWS = 2_000


@pytest.fixture(scope="module")
def deployment() -> Iterator[HostsDeployment]:
    why_not = namespaces_unavailable()
    if why_not:
        pytest.skip(f"the multi-host tier needs network namespaces: {why_not}")
    root = Path(tempfile.mkdtemp(prefix="airflow-jetstream-hosts-", dir="/var/tmp"))  # not under /tmp: see hosts.py
    hosts = HostsDeployment(root)
    try:
        hosts.start()  # this thread enters the hosts' client namespace until close()
        yield hosts
    finally:
        hosts.close(graceful=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def nats_settings(deployment: HostsDeployment) -> ConnectionSettings:
    return ConnectionSettings(servers=deployment.nats_servers, user=NATS_USER, password=deployment.nats_password,
                              tls_ca_file=str(deployment.root / "control" / "tls" / "ca.pem"), connect_timeout=5,
                              request_timeout=10)


def on_host(deployment: HostsDeployment, name: str, script: str) -> str:
    """The output of ``sh -c script`` run on host ``name`` as its processes run."""
    host = deployment.hosts[name]
    done = subprocess.run(host.command(["sh", "-c", script]), env=host.env(), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, f"on {name}: {script}: {done.stdout}{done.stderr}"
    return done.stdout


def test_each_host_has_its_own_address_tmp_and_files(deployment: HostsDeployment) -> None:
    hosts = deployment.hosts.hosts
    for name in hosts:
        on_host(deployment, name, f"echo {name} > /tmp/written-by-{name}")
    for name, host in hosts.items():
        seen = on_host(deployment, name, "ip -4 -o addr show; echo TMP; ls /tmp; echo PRIVATE; "
                       f"ls {host.root / 'private'}/*; echo SHARED; ls -d {host.root / 'shared'}/* 2>/dev/null; "
                       f"echo RO; touch {REPO / 'dags_examples' / '.written'} 2>&1 || true")
        addresses, rest = seen.split("TMP", 1)
        tmp, rest = rest.split("PRIVATE", 1)
        private, rest = rest.split("SHARED", 1)
        shared, read_only = rest.split("RO", 1)
        assert f"inet {host.address}/24" in addresses, addresses
        assert [line for line in tmp.split() if line.startswith("written-by-")] == [f"written-by-{name}"]
        for other in hosts:
            if other != name:
                assert f"private/{other}:\n\n" in private or f"private/{other}:\n" in private, private
        assert "Read-only file system" in read_only, read_only
        assert bool(shared.strip()) == (name in WORKER_HOSTS) or not shared.strip(), shared
    listening = {name: on_host(deployment, name, "ss -ltnH") for name in hosts}
    for name, table in listening.items():
        local = {line.split()[3].rsplit(":", 1)[0].removeprefix("[::ffff:").rstrip("]")  # a JVM's IPv4-mapped form
                 for line in table.splitlines() if line.strip()}
        assert local <= {hosts[name].address}, f"{name} listens on {local}, not only on {hosts[name].address}"


def wait_dag_parsed(airflow: LocalAirflow, dag_id: str) -> None:
    wait_until(lambda: airflow.query("SELECT 1 FROM dag WHERE dag_id = :dag AND NOT is_stale", dag=dag_id),
               f"the dag-processor to load {dag_id}", timeout=240, every=0.5)


def trigger(airflow: LocalAirflow, dag_id: str, conf: dict | None = None) -> str:
    wait_dag_parsed(airflow, dag_id)
    run = Api(airflow).call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
    return str(run["dag_run_id"])


def run_state(airflow: LocalAirflow, dag_id: str, run_id: str) -> str | None:
    rows = airflow.query("SELECT state FROM dag_run WHERE dag_id = :dag AND run_id = :run", dag=dag_id, run=run_id)
    return rows[0][0] if rows else None


def wait_run(airflow: LocalAirflow, dag_id: str, run_id: str, timeout: float = 900) -> None:
    wait_until(lambda: run_state(airflow, dag_id, run_id) in ("success", "failed"), f"{dag_id} {run_id} to finish",
               timeout=timeout, every=1)
    states = dict(airflow.query("SELECT task_id, state FROM task_instance WHERE dag_id = :dag AND run_id = :run",
                                dag=dag_id, run=run_id))
    assert run_state(airflow, dag_id, run_id) == "success", states


def task_hosts(airflow: LocalAirflow, dag_id: str, run_id: str) -> dict[str, str]:
    return dict(airflow.query("SELECT task_id, hostname FROM task_instance WHERE dag_id = :dag AND run_id = :run",
                              dag=dag_id, run=run_id))


def test_orders_pipeline_runs_its_spark_jobs_from_a_worker_host_on_the_master_of_another(
        deployment: HostsDeployment) -> None:
    airflow = deployment.airflow
    run_id = trigger(airflow, PIPELINE, {"rows": ROWS})
    wait_run(airflow, PIPELINE, run_id)
    workers = {deployment.hosts[name].address for name in WORKER_HOSTS}
    ran_on = task_hosts(airflow, PIPELINE, run_id)
    assert set(ran_on.values()) <= workers, ran_on
    summary = json.loads((deployment.root / "shared" / "output" / "summary.json").read_text())
    assert summary["rows_produced"] == summary["rows_consumed"] == summary["distinct_orders"] == ROWS, summary
    assert summary["messages_left_in_raw"] == 0, summary
    assert deployment.spark is not None
    apps = deployment.spark.status()["completedapps"]
    assert {"produce-orders", "consume-orders"} <= {app["name"] for app in apps}, apps


def processed(settings: ConnectionSettings) -> set[int]:
    async def go() -> set[int]:
        async with open_connection(settings) as conn:
            return {int(key.split(".")[1]) for key in await kv_keys(conn.js, "orders_ready_processed")}

    return asyncio.run(go())


def test_event_driven_and_incremental_dags_run_on_their_own(deployment: HostsDeployment,
                                                              nats_settings: ConnectionSettings) -> None:
    airflow = deployment.airflow
    run_id = trigger(airflow, PUBLISH_READY, {"count": 5})
    wait_run(airflow, PUBLISH_READY, run_id, timeout=300)
    wait_until(lambda: len(processed(nats_settings)) >= 5, "process_ready_orders to process the 5 orders",
               timeout=300, every=1)
    assert processed(nats_settings) == {1, 2, 3, 4, 5}
    triggerers = {host for (host,) in airflow.query("SELECT hostname FROM job WHERE job_type = 'TriggererJob'")}
    assert len(triggerers) == 2, triggerers
    wait_until(lambda: airflow.query("SELECT 1 FROM dag_run WHERE dag_id = :dag AND run_type = 'scheduled' "
                                     "AND state = 'success'", dag=INCREMENTAL),
               "the hourly incremental DAG's scheduled run to succeed", timeout=600, every=2)


def test_view_and_test_button_answer_from_the_api_server_host(deployment: HostsDeployment) -> None:
    api = Api(deployment.airflow)
    view = api.call("GET", "/jetstream/api/connections/nats_default")
    assert any(stream["name"] == "ORDERS_AGG" for stream in view["streams"]), view
    conn = {c["connection_id"]: c for c in api.call("GET", "/api/v2/connections")["connections"]}["nats_default"]
    tested = api.call("POST", "/api/v2/connections/test",
                      {k: conn[k] for k in ("connection_id", "conn_type", "host", "port", "login", "extra")} |
                      {"password": deployment.nats_password})
    assert tested["status"] is True and "JetStream enabled" in tested["message"], tested
