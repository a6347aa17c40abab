"""The multi-host tier's one deployment (a module fixture: tests/test_hosts_deployment.py) and what its tests do
with it: trigger a DAG through the REST API, wait for a run, read the streams.

The deployment's settings make host faults cost seconds, not Airflow's defaults' minutes: a task whose host died
is failed after 30 s without a heartbeat (default 300 s) and retried after 5 s (default: no retry, 300 s delay); a
shared-stream event that a cut-off triggerer cannot store is failed after 45 s (default 300 s), so its message goes
to the other triggerer. The test DAGs of ``tests/airflow_dags`` are a second DAG bundle beside the examples.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_jetstream.client import ConnectionSettings, stream_info
from airflow_jetstream.client.errors import StreamNotFoundError
from tests.infra.airflow_local import LocalAirflow
from tests.infra.hosts import REPO, namespaces_unavailable
from tests.infra.hosts_deployment import NATS_USER, HostsDeployment
from tests.support.airflow_api import Api
from tests.support.nats_calls import call_on_server
from tests.support.polling import wait_until

#: The raw stream's duplicate window in the tier (the example's default is 10 minutes): a host cut off for longer
#: costs a minute, not ten.
DUPLICATE_WINDOW_SECONDS = 30
#: ``[triggerer] shared_stream_ack_timeout`` in the tier (Airflow's default is 300 s): how long a triggerer cut off
#: from the database holds a watcher's messages before it fails their events and the watcher naks them.
SHARED_STREAM_ACK_TIMEOUT = 45
#: ``[triggerer] capacity`` (default 1,000): one triggerer holds the 1,000 sensors and the watchers once the other is
#: cut off.
TRIGGERER_CAPACITY = 1100
#: The event-driven example's watcher hands out at most this many messages not yet confirmed stored (its default is
#: its batch size, 64): the bound on the repeat events after a triggerer was cut off or stalled.
MAX_UNCONFIRMED = 4
#: The examples (``[core] dags_folder``) and the tier's test DAGs (tests/airflow_dags), the same paths on every host.
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
DAG_BUNDLES = [{"name": "dags-folder", "classpath": LOCAL_BUNDLE, "kwargs": {}},
               {"name": "test-dags", "classpath": LOCAL_BUNDLE,
                "kwargs": {"path": str(REPO / "tests" / "airflow_dags")}}]
#: The consumer's claim deadline in the tier (the ledger's ``visibility_timeout``; the example's default is 10
#: minutes): a consumer host cut off for longer loses its claims to the next attempt in seconds, not ten minutes.
CLAIM_DEADLINE_SECONDS = 20
FAULT_SETTINGS = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__CORE__DEFAULT_TASK_RETRIES": "2",
    "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "5",
    "JETSTREAM_DEMO_DUPLICATE_WINDOW": f"{DUPLICATE_WINDOW_SECONDS}s",
    "AIRFLOW__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": str(SHARED_STREAM_ACK_TIMEOUT),
    "AIRFLOW__TRIGGERER__CAPACITY": str(TRIGGERER_CAPACITY),
    "JETSTREAM_DEMO_MAX_UNCONFIRMED": str(MAX_UNCONFIRMED),
    "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(DAG_BUNDLES),
    "JETSTREAM_DEMO_CLAIM_DEADLINE": f"{CLAIM_DEADLINE_SECONDS}s",
}


@contextlib.contextmanager
def started_deployment() -> Iterator[HostsDeployment]:
    """A running deployment in a new folder, thrown away afterwards; the calling thread is in the hosts' client
    namespace meanwhile. Skips (saying why) where network namespaces cannot be made."""
    why_not = namespaces_unavailable()
    if why_not:
        pytest.skip(f"the multi-host tier needs network namespaces: {why_not}")
    root = Path(tempfile.mkdtemp(prefix="airflow-jetstream-hosts-", dir="/var/tmp"))  # not under /tmp: see hosts.py
    deployment = HostsDeployment(root, settings=FAULT_SETTINGS)
    try:
        yield deployment.start()
    finally:
        deployment.close(graceful=False)
        shutil.rmtree(root, ignore_errors=True)


def nats_settings(deployment: HostsDeployment) -> ConnectionSettings:
    """The NATS cluster as the tests (on the client host) reach it: TLS, the password."""
    return ConnectionSettings(servers=deployment.nats_servers, user=NATS_USER, password=deployment.nats_password,
                              tls_ca_file=str(deployment.root / "control" / "tls" / "ca.pem"), connect_timeout=5,
                              request_timeout=10)


def trigger(airflow: LocalAirflow, dag_id: str, conf: dict[str, Any] | None = None) -> str:
    wait_until(lambda: airflow.query("SELECT 1 FROM dag WHERE dag_id = :dag AND NOT is_stale", dag=dag_id),
               f"the dag-processor to load {dag_id}", timeout=240, every=0.5)
    run = Api(airflow).call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
    return str(run["dag_run_id"])


def run_state(airflow: LocalAirflow, dag_id: str, run_id: str) -> str | None:
    rows = airflow.query("SELECT state FROM dag_run WHERE dag_id = :dag AND run_id = :run", dag=dag_id, run=run_id)
    return rows[0][0] if rows else None


def task_rows(airflow: LocalAirflow, dag_id: str, run_id: str) -> dict[str, tuple[str, str, int]]:
    """``task_id -> (state, hostname, try_number)`` of a run."""
    rows = airflow.query("SELECT task_id, state, hostname, try_number FROM task_instance WHERE dag_id = :dag "
                         "AND run_id = :run", dag=dag_id, run=run_id)
    return {task: (state, host, tries) for task, state, host, tries in rows}


def wait_run(airflow: LocalAirflow, dag_id: str, run_id: str, timeout: float = 900) -> None:
    """Wait until the run finished and assert it succeeded (the task states in the message if not)."""
    wait_until(lambda: run_state(airflow, dag_id, run_id) in ("success", "failed"), f"{dag_id} {run_id} to finish",
               timeout=timeout, every=1)
    assert run_state(airflow, dag_id, run_id) == "success", task_rows(airflow, dag_id, run_id)


def stream_messages(settings: ConnectionSettings, stream: str) -> int:
    """How many messages ``stream`` holds (0 before the first pipeline run makes it)."""
    try:
        return int(call_on_server(settings, stream_info, stream)["state"]["messages"])
    except StreamNotFoundError:
        return 0
