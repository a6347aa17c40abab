"""The provider as an Airflow user sees it: the airflow CLI in a subprocess, and a real `airflow dags test`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import AUTH_PASSWORD, AUTH_USER
from tests.support.airflow_cli import isolated_airflow_env, nats_conn_json, run_airflow

pytestmark = pytest.mark.airflow_cli
@pytest.fixture
def airflow_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    return isolated_airflow_env(home, AIRFLOW__CORE__TEST_CONNECTION="Enabled")


def test_provider_is_listed_with_hook_and_form_fields(airflow_env):
    listed = run_airflow(["providers", "list", "-o", "json"], airflow_env)
    assert listed.returncode == 0, listed.stderr
    packages = {p["package_name"]: p for p in json.loads(listed.stdout)}
    assert packages["airflow-jetstream"]["version"] == "0.1.0"

    hooks = run_airflow(["providers", "hooks", "-o", "json"], airflow_env)
    nats = [h for h in json.loads(hooks.stdout) if h.get("connection_type") == "nats"]
    assert nats and nats[0]["class"] == "airflow_jetstream.hooks.jetstream.JetStreamHook"

    widgets = run_airflow(["providers", "widgets", "-o", "json"], airflow_env)
    names = {w["connection_parameter_name"] for w in json.loads(widgets.stdout)}
    assert {"extra__nats__token", "extra__nats__nkey_seed_secret", "extra__nats__tls_ca_file"} <= names


def test_connections_test_live_and_dead(airflow_env, nats_server_factory):
    live = nats_server_factory()
    dead = nats_server_factory()
    dead_url = dead.url
    dead.stop()
    env = dict(airflow_env)
    env["AIRFLOW_CONN_NATS_LIVE"] = nats_conn_json(live.url)
    env["AIRFLOW_CONN_NATS_DEAD"] = nats_conn_json(dead_url, extra={"connect_timeout": 1})
    ok = run_airflow(["connections", "test", "nats_live"], env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Connection success!" in ok.stdout
    assert live.monitor("varz")["total_connections"] >= 1
    bad = run_airflow(["connections", "test", "nats_dead"], env)
    assert "Connection failed!" in bad.stdout
    assert "could not connect to NATS" in bad.stdout


def test_dags_test_runs_operator_without_leaking_secrets(airflow_env, user_server):
    dag_file = Path(airflow_env["AIRFLOW__CORE__DAGS_FOLDER"]) / "ensure_stream_dag.py"
    dag_file.write_text(textwrap.dedent(
        """
        import pendulum
        from airflow.sdk import DAG
        from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator

        with DAG("ensure_stream_cli", start_date=pendulum.datetime(2026, 1, 1), schedule=None):
            JetStreamEnsureStreamOperator(
                task_id="ensure", nats_conn_id="nats_auth",
                config={"name": "CLI_ORDERS", "subjects": ["cli.orders.>"], "allow_atomic": True},
            )
        """
    ))
    env = dict(airflow_env)
    env["AIRFLOW_CONN_NATS_AUTH"] = nats_conn_json(user_server.url, login=AUTH_USER, password=AUTH_PASSWORD)
    migrate = run_airflow(["db", "migrate"], env)
    assert migrate.returncode == 0, migrate.stderr[-2000:]
    run = run_airflow(["dags", "test", "ensure_stream_cli"], env)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert "Created stream CLI_ORDERS" in output
    logs = "".join(p.read_text(errors="replace") for p in Path(env["AIRFLOW_HOME"]).rglob("*.log"))
    assert AUTH_PASSWORD not in output + logs
    assert user_server.monitor("jsz")["streams"] == 1
