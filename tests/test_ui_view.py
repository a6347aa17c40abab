"""The JetStream view (airflow_jetstream/ui): its FastAPI app behind Airflow's real auth manager, against a real
nats-server (token auth) holding the trouble an on-call engineer meets (tests/support/jetstream_view.py).

The app is mounted under ``/jetstream`` in a FastAPI app with Airflow's SimpleAuthManager (as the api-server
does); users log in with JWTs the auth manager signs, sent as the UI's ``_token`` cookie. Thresholds come from
Airflow's ``[jetstream]`` section (env), short enough that the trouble is a problem at once.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from airflow_jetstream.ui import app as view_app
from tests.support import jetstream_view as seeded
from tests.support.airflow_cli import nats_conn_json
from tests.support.airflow_ui import free_port
from tests.support.polling import wait_until
from tests.support.stall import resume, stop

TOKEN = "view-t0ken-not-for-pages"
CONN = "nats_view"
PAGE = f"/jetstream/connections/{CONN}"
API = f"/jetstream/api/connections/{CONN}"
HTML = {"accept": "text/html,application/xhtml+xml"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("nats-view"), jetstream=seeded.SERVER_JETSTREAM,
                                config={"authorization": {"token": TOKEN}}).start()
    settings = ConnectionSettings(servers=server.url, token=TOKEN, connect_timeout=2, request_timeout=5)
    seeded.seed_view_data(settings)
    seeded.seed_trouble(settings)
    yield server
    server.close()


@pytest.fixture(scope="module")
def airflow_app(server: EmbeddedNatsServer) -> Iterator[FastAPI]:
    with seeded.mounted_view({CONN: nats_conn_json(server.url, extra={"token": TOKEN})}) as app:
        yield app


@pytest.fixture(scope="module")
def admin(airflow_app: FastAPI) -> TestClient:
    return seeded.client(airflow_app, "ADMIN")


@pytest.fixture(scope="module")
def snapshot(admin: TestClient) -> dict:
    reply = admin.get(API, params={"per_page": 1000})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _problems(snapshot: dict, kind: str) -> list[dict]:
    return [p for p in snapshot["problems"]["problems"] if p["kind"] == kind]


# ------------------------------------------------------------------------------------------ login and access


@pytest.mark.parametrize("path", ["/jetstream/", PAGE, API, f"{API}?ledger_bucket=nope"])
def test_api_clients_without_login_get_401(airflow_app: FastAPI, path: str) -> None:
    anonymous = seeded.client(airflow_app, None)
    reply = anonymous.get(path)
    assert reply.status_code == 401 and seeded.STREAM not in reply.text
    anonymous.cookies.set("_token", "not-a-jwt")
    forged = anonymous.get(path)
    assert forged.status_code in (401, 403) and seeded.STREAM not in forged.text


@pytest.mark.parametrize("path", ["/jetstream/", f"{PAGE}?stream={seeded.AGG}"])
def test_a_browser_without_login_goes_to_airflows_login_and_back(airflow_app: FastAPI, path: str) -> None:
    anonymous = seeded.client(airflow_app, None)
    reply = anonymous.get(path, headers=HTML)
    assert reply.status_code == 303, reply.text
    login = urlsplit(reply.headers["location"])
    assert login.path == "/auth/login" and parse_qs(login.query)["next"] == [path], reply.headers["location"]
    anonymous.cookies.set("_token", "not-a-jwt")
    assert anonymous.get(path, headers=HTML).status_code == 303  # an invalid session too
    assert anonymous.get(API, headers=HTML).status_code in (401, 403)  # the JSON API never redirects


def test_viewer_without_connection_access_is_refused(airflow_app: FastAPI) -> None:
    viewer = seeded.client(airflow_app, "VIEWER")
    for path in (PAGE, API):
        reply = viewer.get(path)
        assert reply.status_code == 403, reply.text
        assert seeded.STREAM not in reply.text
    assert viewer.get(PAGE, headers=HTML).status_code == 403  # logged in: no login redirect
    assert viewer.get("/jetstream/").status_code == 200  # the index lists only what the user may read


def test_markup_in_a_query_parameter_comes_back_as_text_under_a_policy_allowing_no_script(admin: TestClient) -> None:
    """The reflected XSS of issue 39: the ledger caption echoed ``run_id`` unescaped. Templates escape every value,
    and the policy would stop a script even if one got through."""
    payload = "<img src=x onerror=alert(1)>"
    reply = admin.get(PAGE, params={"run_id": payload}, headers=HTML)
    assert reply.status_code == 200, reply.text
    assert "<img" not in reply.text and "&lt;img src=x onerror=alert(1)&gt;" in reply.text
    policy = reply.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src" not in policy and "frame-ancestors 'self'" in policy
    [sheet] = re.findall(r'<link rel="stylesheet" href="([^"]+)">', reply.text)
    css = admin.get(sheet)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css") and "tr.row-error" in css.text
    assert 'style=' not in reply.text and "<style" not in reply.text, "no inline style: the policy allows none"


# ------------------------------------------------------------------------------------------ problems first


def test_problems_name_kind_object_why_and_since_worst_first(snapshot: dict) -> None:
    problems = snapshot["problems"]["problems"]
    assert snapshot["problems"]["total"] == len(problems) and snapshot["problems"]["errors"] >= 4
    for problem in problems:
        assert set(problem) >= {"kind", "severity", "object", "why", "since", "since_means", "fix", "anchor", "at"}
        assert problem["since"], problem
    severities = [p["severity"] for p in problems]
    assert severities == sorted(severities, key=["error", "warning"].index), "errors first"
    for severity in ("error", "warning"):
        since = [p["since"] for p in problems if p["severity"] == severity]
        assert since == sorted(since), f"{severity}s: the oldest first"

    [abandoned] = _problems(snapshot, "batch_abandoned")
    assert abandoned["object"]["batch"] == seeded.ABANDONED_BATCH and abandoned["object"]["stream"] == seeded.TROUBLE
    assert abandoned["since_means"] == "advisory time" and abandoned["at"]["section"] == "advisories"
    [given_up] = _problems(snapshot, "max_deliveries")
    assert given_up["object"]["consumer"] == seeded.POISON
    consumers = {(p["kind"], p["object"].get("consumer")) for p in problems if p["object"]["type"] == "consumer"}
    assert {("consumer_redelivering", seeded.SLOW), ("ack_overdue", seeded.SLOW), ("consumer_idle", seeded.IDLE),
            ("consumer_paused", seeded.PAUSED)} <= consumers, consumers
    [inactive] = _problems(snapshot, "source_inactive")
    assert (inactive["object"]["stream"], inactive["object"]["source"]) == (seeded.BROKEN_AGG, seeded.TROUBLE)
    [failed] = _problems(snapshot, "ledger_failed")
    assert failed["object"]["run_id"] == seeded.TROUBLE_RUN and failed["object"]["batches"] == [seeded.FAILED_BATCH]
    assert "bad row 17" in failed["why"]
    [overdue] = _problems(snapshot, "ledger_overdue")
    assert overdue["object"]["batches"] == [seeded.OVERDUE_BATCH] and overdue["since_means"] == "visibility deadline"
    assert not _problems(snapshot, "section_unreadable") and not _problems(snapshot, "read_incomplete")
    assert snapshot["thresholds"]["pending_idle"] == 1.0  # from [jetstream] problem_pending_idle


def test_a_source_whose_backlog_does_not_shrink_becomes_a_problem(admin: TestClient) -> None:
    """The stalled source's origin consumer is paused: its backlog stays, so a later read flags it."""

    def stalled() -> list[dict]:
        return [p for p in admin.get(API, params={"per_page": 1000}).json()["problems"]["problems"]
                if p["kind"] == "source_stalled" and p["object"]["stream"] == seeded.STALLED_AGG]

    # two view reads 1 s apart suffice (PROBLEM_SOURCE_STALLED is 1s here); on a loaded box each read may take seconds
    wait_until(stalled, "a source_stalled problem for the paused source", timeout=120)
    [problem] = stalled()
    assert problem["object"]["source"] == seeded.STALLED_ORIGIN and "not shrinking" in problem["why"]


def test_html_puts_problems_on_top_and_marks_rows_worst_first(admin: TestClient) -> None:
    html = admin.get(PAGE, params={"per_page": 1000}).text
    summary = html.index('id="problems"')
    assert summary < html.index('id="section-streams"')
    assert 'data-level="error"' in html and "Problems: " in html
    consumers = re.findall(r'<tr id="consumer-[^"]+"(?: class="row-(\w+)")?', html)
    marks = [mark or "none" for mark in consumers]
    assert marks == sorted(marks, key=["error", "warning", "none"].index) and marks[0] == "warning", marks
    assert re.search(rf'<tr id="consumer-{seeded.TROUBLE}-{seeded.SLOW}" class="row-warning"', html)
    [row] = [row for row in re.findall(r'<tr id="advisory-\d+"([^>]*)>(.*?)</tr>', html, re.S)
             if "batch_abandoned</b>" in row[1]]
    assert 'class="row-error"' in row[0] and f"batch={seeded.ABANDONED_BATCH}" in row[1] and "reason=timeout" in row[1]
    assert f'id="run-{seeded.TROUBLE_RUN.replace(":", "%3A").replace("+", "%2B")}" class="row-error"' in html
    assert TOKEN not in html


def test_an_event_watcher_waiting_for_a_stream_that_does_not_exist_is_a_problem(admin: TestClient) -> None:
    """The asset watcher's trigger, as the scheduler stores it: the view lists it until its stream exists."""
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session

    from airflow_jetstream.triggers.message import JetStreamMessageTrigger

    with create_session() as session:
        row = Trigger.from_object(JetStreamMessageTrigger(stream="ORDERS_LATER", consumer="airflow_later",
                                                          nats_conn_id=CONN))
        other = Trigger.from_object(JetStreamMessageTrigger(stream="ORDERS_ELSEWHERE", consumer="c",
                                                            nats_conn_id="nats_other"))
        session.add_all([row, other])
        session.flush()
        trigger_id = row.id
    try:
        body = admin.get(API, params={"per_page": 1000}).json()
        [waiting] = [p for p in body["problems"]["problems"] if p["kind"] == "watcher_waiting"]
        assert waiting["object"] == {"type": "watcher", "stream": "ORDERS_LATER", "consumer": "airflow_later",
                                     "trigger_id": trigger_id, "name": None}
        assert waiting["severity"] == "warning" and waiting["since_means"] == "watcher created"
        page = admin.get(PAGE, headers=HTML).text
        assert 'data-kind="watcher_waiting"' in page and "ORDERS_LATER" in page
    finally:
        with create_session() as session:
            session.query(Trigger).filter(Trigger.classpath.like("airflow_jetstream.%")).delete()
    assert not [p for p in admin.get(API).json()["problems"]["problems"] if p["kind"] == "watcher_waiting"]


# ------------------------------------------------------------------------------------------ reading never writes


def test_reading_the_view_writes_nothing(admin: TestClient, server: EmbeddedNatsServer) -> None:
    """Page loads (cache off) add no message to the capture stream and create no consumer anywhere."""
    settings = ConnectionSettings(servers=server.url, token=TOKEN)

    async def state() -> tuple[int, int, int]:
        async with open_connection(settings) as conn:
            capture = await conn.api_request("STREAM.INFO.ADVISORIES")
            account = await conn.api_request("INFO")
            return capture["state"]["last_seq"], account["consumers"], account["streams"]

    before = asyncio.run(state())
    for params in ({}, {"format": "json"}, {"run_id": seeded.TROUBLE_RUN}, {"stream": seeded.AGG}, {}):
        assert admin.get(PAGE, params=params).status_code == 200
    assert admin.get(API).json()["advisories"]["method"] == "direct_batch"
    assert asyncio.run(state()) == before


# ------------------------------------------------------------------------------------------ nothing hidden


def test_every_section_says_showing_n_of_m_and_pages(admin: TestClient, snapshot: dict) -> None:
    streams = snapshot["streams"]
    assert streams["total"] == streams["exist"] == streams["read"] > seeded.FILLER_STREAMS > 50
    first = admin.get(API, params={"per_page": 10}).json()
    for section in ("streams", "consumers", "sources", "ledger", "advisories", "problems"):
        data = first[section]
        assert data["page"] == 1 and data["first"] == 1 and data["shown"] <= 10, section
        assert data["pages"] == -(-data["total"] // 10), section
    page_two = admin.get(API, params={"per_page": 10, "streams_page": 2}).json()["streams"]
    assert page_two["first"] == 11 and page_two["streams"][0]["name"] not in {
        row["name"] for row in first["streams"]["streams"]}
    html = admin.get(PAGE, params={"per_page": 10}).text
    assert "showing 1-10 of" in html and 'href="?per_page=10&amp;streams_page=2#section-streams"' in html
    pages = re.search(r'<p class="count" data-count="streams">[^<]*&middot; page (<b>1</b> <a [^>]*>2</a> .*?)</p>',
                      html)
    assert pages and re.sub(r"<[^>]+>", "", pages.group(1)).split() == ["1", "2", str(first["streams"]["pages"])]


def test_a_stream_past_the_first_page_keeps_its_consumers_sources_and_anchor(admin: TestClient) -> None:
    everything = admin.get(API).json()  # the default 50 rows per page
    assert seeded.AGG not in {row["name"] for row in everything["streams"]["streams"]}, "AGG is past page 1"
    assert seeded.AGG in everything["other_streams"]
    html = admin.get(PAGE).text
    assert f'<a id="stream-{seeded.AGG}" href="?stream={seeded.AGG}#stream-{seeded.AGG}"' in html
    focused = admin.get(API, params={"stream": seeded.AGG}).json()
    assert [row["name"] for row in focused["streams"]["streams"]] == [seeded.AGG]
    assert [(row["stream"], row["source"]) for row in focused["sources"]["sources"]] == [(seeded.AGG, seeded.STREAM)]
    trouble = admin.get(API, params={"stream": seeded.TROUBLE}).json()
    names = {row["name"] for row in trouble["consumers"]["consumers"]}
    assert names == {seeded.SLOW, seeded.POISON, seeded.IDLE}
    assert trouble["problems"]["total"] == everything["problems"]["total"], "problems are never narrowed"


# ------------------------------------------------------------------------------------------ status codes


def test_connection_missing_or_of_another_type_is_a_4xx_naming_why(admin: TestClient) -> None:
    missing = admin.get("/jetstream/api/connections/nats_nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["reason"] == "connection_not_found"
    spark = admin.get("/jetstream/api/connections/spark_there")
    assert spark.status_code == 400, spark.text
    assert spark.json()["error"]["reason"] == "wrong_connection_type" and "'spark'" in spark.json()["detail"]
    page = admin.get("/jetstream/connections/spark_there", headers=HTML)
    assert page.status_code == 400 and "wrong_connection_type" in page.text


@pytest.mark.parametrize("query", ["per_page=0", "per_page=abc", "streams_page=0", "ledger_before=-3", "format=xml"])
def test_malformed_query_parameters_are_422(admin: TestClient, query: str) -> None:
    assert admin.get(f"{PAGE}?{query}").status_code == 422
    page = admin.get(f"{PAGE}?{query}", headers=HTML)
    assert page.status_code == 422 and page.headers["content-type"].startswith("text/html"), page.text
    assert "invalid_parameter" in page.text


@pytest.mark.parametrize("name", ["ledger_bucket", "capture_stream", "stream"])
@pytest.mark.parametrize("value", ["", "a.b", "a*", "a>", "a/b", "a b", "x" * 256, "a:b"])
def test_a_name_that_cannot_be_one_is_400_naming_the_rule_in_html_and_json(admin: TestClient, name: str,
                                                                           value: str) -> None:
    """One rule, whatever the character (issue 39: a dot was a 400, a colon or an empty name 200 or 422): a
    ledger bucket is a KV bucket name (letters, digits, '_', '-'), a capture stream or a focus stream a stream name
    (no '.', '*', '>', '/', '\\' or white space, 1-255 characters; ':' is allowed)."""
    if name != "ledger_bucket" and value == "a:b":
        assert admin.get(API, params={name: value}).status_code == 200
        return
    reply = admin.get(API, params={name: value})
    assert reply.status_code == 400, reply.text[:300]
    error = reply.json()["error"]
    assert error["reason"] in ("invalid_name", "invalid_bucket") and reply.json()["detail"] == error["message"]
    assert re.search(r"cannot hold|at most 255|non-empty|letters, digits", error["message"]), error
    page = admin.get(PAGE, params={name: value}, headers=HTML)
    assert page.status_code == 400 and error["message"] in html.unescape(page.text)


def test_a_missing_bucket_or_capture_stream_says_so(admin: TestClient) -> None:
    snap = admin.get(API, params={"ledger_bucket": "no_such_bucket", "capture_stream": "NO_CAPTURE"}).json()
    assert snap["ledger"]["error"]["reason"] == "ledger_not_found"
    assert snap["advisories"]["error"]["reason"] == "stream_not_found"
    assert [p["kind"] for p in snap["problems"]["problems"] if p["kind"] == "capture_missing"] == ["capture_missing"]


def test_nats_unreachable_is_503_with_the_typed_error(admin: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NATS_DEAD", nats_conn_json(f"nats://127.0.0.1:{free_port()}"))
    reply = admin.get("/jetstream/api/connections/nats_dead")
    assert reply.status_code == 503 and reply.headers["retry-after"]
    body = reply.json()
    assert body["error"]["reason"] and "127.0.0.1" in body["error"]["message"] and "streams" not in body
    page = admin.get("/jetstream/connections/nats_dead", headers=HTML)
    assert page.status_code == 503 and "NATS cannot be read" in page.text


@pytest.mark.parametrize("credential", ["wrong_token", "malformed_seed", "not_a_creds_file"])
def test_a_bad_credential_is_a_typed_4xx_or_503_never_500(admin: TestClient, server: EmbeddedNatsServer,
                                                           monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           credential: str) -> None:
    """A malformed NKey seed answered 500 (nats-py's AssertionError from closing a client that never connected)."""
    garbage = tmp_path / "garbage.creds"
    garbage.write_text("PLANTED-not-a-creds-file")
    extra = {"wrong_token": {"token": "PLANTED-wrong-token"}, "malformed_seed": {"nkey_seed_secret": "SUAPLANTED"},
             "not_a_creds_file": {"creds_file": str(garbage)}}[credential]
    monkeypatch.setenv("AIRFLOW_CONN_NATS_BAD", nats_conn_json(server.url, extra=extra))
    for headers in ({}, HTML):
        reply = admin.get("/jetstream/api/connections/nats_bad" if not headers else "/jetstream/connections/nats_bad",
                          headers=headers)
        assert reply.status_code in (400, 503), (reply.status_code, reply.text[:500])
        assert "PLANTED" not in reply.text
    assert admin.get("/jetstream/api/connections/nats_bad").json()["error"]["reason"] in (
        "authentication_failed", "invalid_settings")


def test_a_stalled_nats_is_503_within_the_request_bound(airflow_app: FastAPI, monkeypatch: pytest.MonkeyPatch,
                                                        nats_server: EmbeddedNatsServer) -> None:
    """SIGSTOP the server: the page answers 503 (view_timeout) instead of hanging, 20 loads make one read, and
    the view answers again once the server resumes."""
    monkeypatch.setenv("AIRFLOW_CONN_NATS_STALLED", nats_conn_json(nats_server.url))
    monkeypatch.setenv("AIRFLOW__JETSTREAM__VIEW_TIMEOUT", "3s")
    monkeypatch.setenv("AIRFLOW__JETSTREAM__VIEW_CACHE_SECONDS", "30")
    path = "/jetstream/api/connections/nats_stalled"
    token = seeded.login_token("ADMIN")
    started = view_app.CACHE.reads_started

    async def loads(count: int) -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=airflow_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://view", cookies={"_token": token},
                                     timeout=60) as client:
            return await asyncio.gather(*(client.get(path) for _ in range(count)))

    stop(nats_server.process.pid)
    try:
        replies = asyncio.run(loads(20))
    finally:
        resume(nats_server.process.pid)
    assert [r.status_code for r in replies] == [503] * 20
    assert replies[0].json()["error"]["reason"] in ("view_timeout", "connection_failed", "timeout"), replies[0].text
    assert view_app.CACHE.reads_started == started + 1, "20 concurrent loads shared one read"
    monkeypatch.setenv("AIRFLOW__JETSTREAM__VIEW_CACHE_SECONDS", "0")
    wait_until(lambda: asyncio.run(loads(1))[0].status_code == 200, "the view to answer after SIGCONT")


# ------------------------------------------------------------------------------------------ links


def test_every_operators_extra_link_reaches_its_streams_row(admin: TestClient, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from airflow_jetstream.operators.consume import JetStreamConsumeOperator
    from airflow_jetstream.operators.consumer import JetStreamConsumerResetOperator
    from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator
    from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator
    from airflow_jetstream.operators.spark_submit import JetStreamSparkSubmitOperator
    from airflow_jetstream.ui.links import JetStreamLedgerRunLink, JetStreamViewLink

    stream = seeded.AGG  # past the first page of the streams table
    operators = [
        JetStreamAtomicBatchPublishOperator(task_id="p", stream=stream, messages=[], nats_conn_id=CONN),
        JetStreamConsumeOperator(task_id="c", stream=stream, consumer="x", apply_function="json.dumps",
                                 nats_conn_id=CONN),
        JetStreamDurableSourceOperator(task_id="s", stream=stream, source=seeded.STREAM, nats_conn_id=CONN),
        JetStreamConsumerResetOperator(task_id="r", stream=stream, consumer="x", nats_conn_id=CONN),
        JetStreamSparkSubmitOperator(task_id="k", application="x.py", stream=stream, nats_conn_id=CONN),
    ]
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://127.0.0.1:40111/airflow/")  # a make up's port
    for operator in operators:
        [link] = [each for each in operator.operator_extra_links if isinstance(each, JetStreamViewLink)]
        url = link.get_link(operator, ti_key=None)
        assert url == f"/airflow{PAGE}?stream={stream}#stream-{stream}", (operator.task_id, url)
        html = admin.get(url.removeprefix("/airflow").split("#")[0]).text
        assert re.search(rf'<tr id="stream-{stream}"', html), operator.task_id

    class RunKey:
        run_id = seeded.TROUBLE_RUN

    [ledger_link] = [each for each in operators[-1].operator_extra_links if isinstance(each, JetStreamLedgerRunLink)]
    url = ledger_link.get_link(operators[-1], ti_key=RunKey())
    anchor = url.split("#")[1]
    assert anchor == "run-" + seeded.TROUBLE_RUN.replace(":", "%3A").replace("+", "%2B")
    html = admin.get(url.removeprefix("/airflow").split("#")[0]).text
    assert f'<tr id="{anchor}" class="row-error"' in html
    monkeypatch.delenv("AIRFLOW__API__BASE_URL")
    assert JetStreamViewLink().get_link(operators[0], ti_key=None).startswith(f"{PAGE}?")


# ------------------------------------------------------------------------------------------ the plugin


def test_registered_as_a_provider_plugin_and_entry_point() -> None:
    from importlib.metadata import entry_points

    from airflow_jetstream.get_provider_info import get_provider_info
    from airflow_jetstream.ui.plugin import ENTRY_POINT_PLUGIN, JetStreamViewPlugin

    info = get_provider_info()
    assert info["plugins"] == [{"name": "jetstream", "plugin-class": "airflow_jetstream.ui.plugin.JetStreamViewPlugin"}]
    assert set(info["config"]["jetstream"]["options"]) >= {"view_timeout", "view_cache_seconds",
                                                           "problem_pending_idle"}
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


# ------------------------------------------------------------------------------------------ escaped by construction

HTML_TAGS = re.compile(r"</?(?:a|b|i|p|br|code|div|span|table|thead|tbody|tr|td|th|h[1-6]|ul|ol|li|form|input|label|"
                       r"button|section|html|head|body|title|meta|link|style|script|img)\b", re.I)


def test_no_html_is_built_in_python() -> None:
    """The view's markup lives in its autoescaping templates: no string literal of airflow_jetstream/ui (f-strings
    included) holds an HTML tag, so no value can reach a page without the template engine escaping it."""
    import ast
    from pathlib import Path

    import airflow_jetstream.ui

    found = []
    for path in Path(airflow_jetstream.ui.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and HTML_TAGS.search(node.value):
                found.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
    assert not found, found
