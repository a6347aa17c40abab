"""The JetStream view (airflow_jetstream/ui): its FastAPI app behind Airflow's real auth manager, against a
real nats-server that requires a token.

The app is mounted under ``/jetstream`` in a FastAPI app with Airflow's SimpleAuthManager (as the
api-server does); users log in with JWTs the auth manager signs, sent as the UI's ``_token`` cookie.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.ui import app as view_app
from airflow_jetstream.ui.links import JetStreamViewLink, view_url
from airflow_jetstream.ui.snapshot import ViewLimits
from tests.support import jetstream_view as seeded
from tests.support.airflow_cli import nats_conn_json
from tests.support.airflow_ui import free_port

TOKEN = "view-t0ken-not-for-pages"
CONN = "nats_view"
PAGE = f"/jetstream/connections/{CONN}"
API = f"/jetstream/api/connections/{CONN}"
AIRFLOW_ENV = {
    "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
    "AIRFLOW__API_AUTH__JWT_SECRET": "jetstream-view-tests-" + "0" * 64,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("nats-view"),
                                config={"authorization": {"token": TOKEN}}).start()
    from airflow_jetstream.client.settings import ConnectionSettings

    seeded.seed_view_data(ConnectionSettings(servers=server.url, token=TOKEN, connect_timeout=2, request_timeout=5))
    yield server
    server.close()


@pytest.fixture(scope="module")
def airflow_app(server: EmbeddedNatsServer) -> Iterator[FastAPI]:
    """Airflow's auth manager and the tables its JWT check and connection listing read, plus the view."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in AIRFLOW_ENV.items():
            mp.setenv(name, value)
        mp.setenv(f"AIRFLOW_CONN_{CONN.upper()}", nats_conn_json(server.url, extra={"token": TOKEN}))
        from airflow import settings
        from airflow.api_fastapi.app import init_auth_manager
        from airflow.models.base import Base
        from airflow.models.connection import Connection
        from airflow.models.revoked_token import RevokedToken

        Base.metadata.create_all(settings.engine, tables=[RevokedToken.__table__, Connection.__table__])
        parent = FastAPI()
        init_auth_manager(parent)
        parent.mount("/jetstream", view_app.app)
        yield parent


def _client(app: FastAPI, role: str | None) -> TestClient:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    client = TestClient(app)
    if role:
        client.cookies.set("_token", get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=role.lower(),
                                                                                            role=role)))
    return client


@pytest.fixture(scope="module")
def admin(airflow_app: FastAPI) -> TestClient:
    return _client(airflow_app, "ADMIN")


@pytest.fixture(scope="module")
def snapshot(admin: TestClient) -> dict:
    reply = admin.get(API)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize("path", ["/jetstream/", PAGE, API, f"{API}?ledger_bucket=nope"])
def test_refused_without_login(airflow_app: FastAPI, path: str) -> None:
    anonymous = _client(airflow_app, None)
    reply = anonymous.get(path)
    assert reply.status_code == 401
    assert "ORDERS" not in reply.text
    anonymous.cookies.set("_token", "not-a-jwt")
    forged = anonymous.get(path)
    assert forged.status_code in (401, 403) and "ORDERS" not in forged.text


def test_viewer_without_connection_access_is_refused(airflow_app: FastAPI) -> None:
    viewer = _client(airflow_app, "VIEWER")
    for path in (PAGE, API):
        reply = viewer.get(path)
        assert reply.status_code == 403, reply.text
        assert "ORDERS" not in reply.text
    assert viewer.get("/jetstream/").status_code == 200  # the index lists only what the user may read


def test_streams_show_counts_and_replica_health(snapshot: dict) -> None:
    streams = {row["name"]: row for row in snapshot["streams"]["streams"]}
    orders = streams[seeded.STREAM]
    assert (orders["messages"], orders["last_seq"], orders["consumer_count"]) == (seeded.MESSAGES, seeded.MESSAGES, 2)
    assert orders["subjects"] == ["orders.>"] and orders["bytes"] > 0
    assert orders["num_replicas"] == 1 and orders["replicas"] == []
    assert streams[seeded.AGG]["sources"] == [seeded.STREAM]
    assert {"ADVISORIES", "KV_batch_ledger"} <= set(streams)
    assert snapshot["streams"]["truncated"] is False
    assert "error" not in snapshot


def test_consumers_show_pending_ack_pending_and_pause(snapshot: dict) -> None:
    consumers = {(row["stream"], row["name"]): row for row in snapshot["consumers"]["consumers"]}
    worker = consumers[(seeded.STREAM, seeded.WORKER)]
    assert (worker["num_pending"], worker["num_ack_pending"], worker["delivered_stream_seq"]) == (
        seeded.MESSAGES - 2, 2, 2)
    assert worker["last_active"] and worker["paused"] is False and worker["durable"] is True
    paused = consumers[(seeded.STREAM, seeded.PAUSED)]
    assert paused["paused"] is True and paused["pause_until"]


def test_sources_show_lag_and_caught_up(snapshot: dict) -> None:
    [source] = [row for row in snapshot["sources"]["sources"] if row["stream"] == seeded.AGG]
    assert source["source"] == seeded.STREAM and source["error"] is None
    assert source["active"] >= 0 and source["lag"] == 0


def test_ledger_per_run_counts_states_and_attempts(snapshot: dict) -> None:
    ledger = snapshot["ledger"]
    assert ledger["bucket"] == "batch_ledger" and ledger["truncated"] is False
    [run] = ledger["runs"]
    assert run["run_id"] == seeded.RUN_ID and run["batches"] == seeded.BATCHES
    assert run["states"] == {"published": seeded.BATCHES - 1, "in_progress": 0, "consumed": 1, "failed": 0}
    assert (run["attempts"], run["max_attempts"], run["messages"]) == (1, 1, 2 * seeded.BATCHES)


def test_recent_advisories_newest_first(snapshot: dict) -> None:
    rows = snapshot["advisories"]["advisories"]
    kinds = {row["kind"] for row in rows}
    assert "consumer_created" in kinds, kinds
    seqs = [row["capture_seq"] for row in rows]
    assert seqs == sorted(seqs, reverse=True)
    skipped = snapshot["advisories"]["api_audit_skipped"]
    assert skipped > 0 and "api_audit" not in kinds  # one per API call: counted, not listed
    assert len(seqs) + skipped == snapshot["advisories"]["messages"]
    assert any(row.get("consumer") == seeded.WORKER for row in rows)


def test_html_page_has_rows_and_no_secret(admin: TestClient) -> None:
    reply = admin.get(PAGE)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html")
    html = reply.text
    for row_id in (f"stream-{seeded.STREAM}", f"consumer-{seeded.STREAM}-{seeded.WORKER}",
                   f"source-{seeded.AGG}-{seeded.STREAM}", f"run-{seeded.RUN_ID}"):
        assert f'id="{row_id}"' in html, row_id
    assert 'data-section="advisories"' in html and "API audit advisories not listed" in html
    assert TOKEN not in html
    assert TOKEN not in json.dumps(admin.get(API).json())


def test_every_section_is_bounded(admin: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(view_app, "LIMITS", ViewLimits(streams=2, consumers=1, sources=0, ledger_keys=2, advisories=1))
    snap = admin.get(API).json()
    assert len(snap["streams"]["streams"]) == 2 and snap["streams"]["total"] >= 4 and snap["streams"]["truncated"]
    assert len(snap["consumers"]["consumers"]) <= 1
    assert snap["sources"]["sources"] == [] and snap["sources"]["truncated"] in (True, False)
    assert snap["ledger"]["keys_read"] == 2 and snap["ledger"]["truncated"] is True
    advisories = snap["advisories"]
    assert len(advisories["advisories"]) + advisories["api_audit_skipped"] == 1 == advisories["limit"]
    assert advisories["truncated"] is True
    assert snap["limits"]["advisories"] == 1
    html = admin.get(PAGE).text
    assert "showing the first 2 of" in html and "read the first 2 ledger keys only" in html


def test_bad_names_unknown_connection_missing_bucket(admin: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    assert admin.get(f"{API}?ledger_bucket=bad.name").status_code == 400
    monkeypatch.delenv("AIRFLOW_CONN_NATS_NOWHERE", raising=False)
    assert admin.get("/jetstream/api/connections/nats_nowhere").status_code == 404
    snap = admin.get(f"{API}?ledger_bucket=no_such_bucket&capture_stream=NO_CAPTURE").json()
    assert snap["ledger"]["error"]["reason"] == "ledger_not_found"
    assert snap["advisories"]["error"]["reason"] == "stream_not_found"
    assert snap["streams"]["streams"], "the other sections still show"


def test_dead_server_is_a_typed_error_not_a_hang(admin: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NATS_DEAD", nats_conn_json(f"nats://127.0.0.1:{free_port()}",
                                                                extra={"connect_timeout": 1}))
    reply = admin.get("/jetstream/api/connections/nats_dead")
    assert reply.status_code == 200
    body = reply.json()
    assert body["error"]["reason"] and "127.0.0.1" in body["error"]["message"]
    assert "streams" not in body


def test_extra_link_points_at_the_view(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_jetstream.operators.consumer import JetStreamConsumerResetOperator
    from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator
    from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator

    publish = JetStreamAtomicBatchPublishOperator(task_id="p", stream="ORDERS", messages=[], nats_conn_id=CONN)
    link = JetStreamViewLink()
    assert link.get_link(publish, ti_key=None) == f"/jetstream/connections/{CONN}#stream-ORDERS"
    for operator in (JetStreamAtomicBatchPublishOperator, JetStreamDurableSourceOperator,
                     JetStreamConsumerResetOperator):
        assert any(isinstance(each, JetStreamViewLink) for each in operator.operator_extra_links)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/")
    assert view_url("nats default") == "https://airflow.example.com/jetstream/connections/nats%20default"


def test_registered_as_a_provider_plugin_and_entry_point() -> None:
    from importlib.metadata import entry_points

    from airflow_jetstream.get_provider_info import get_provider_info
    from airflow_jetstream.ui.plugin import ENTRY_POINT_PLUGIN, JetStreamViewPlugin

    info = get_provider_info()
    assert info["plugins"] == [{"name": "jetstream", "plugin-class": "airflow_jetstream.ui.plugin.JetStreamViewPlugin"}]
    [entry] = [ep for ep in entry_points(group="airflow.plugins") if ep.name == "jetstream"]
    assert entry.load() is ENTRY_POINT_PLUGIN
    lazy = os.environ.get("AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS", "True").lower() != "false"
    assert ENTRY_POINT_PLUGIN is (JetStreamViewPlugin if lazy else None)
    [fastapi_app] = JetStreamViewPlugin.fastapi_apps
    assert fastapi_app["url_prefix"] == "/jetstream"


def test_plugin_mounts_the_view_without_importing_it_until_a_request() -> None:
    """Task processes load plugins too: the plugin module must not import the FastAPI app."""
    import subprocess
    import sys

    code = ("import sys, airflow_jetstream.ui.plugin as p; "
            "print('airflow_jetstream.ui.app' in sys.modules, 'airflow.api_fastapi.app' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.splitlines()[-1].split() == ["False", "False"], loaded.stdout[-2000:]
    from airflow_jetstream.ui.plugin import JetStreamViewPlugin

    parent = FastAPI()
    parent.mount("/jetstream", JetStreamViewPlugin.fastapi_apps[0]["app"])
    assert TestClient(parent).get("/jetstream/api/connections/x").status_code == 401  # the real app answered
