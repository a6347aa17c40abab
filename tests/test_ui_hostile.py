"""The JetStream view under hostile input (issue 39): HTML and script payloads through every input it takes, and its
JSON API fuzzed against its own OpenAPI schema.

Inputs: each query parameter, the connection id in the path, and what a client can store on the server the view
reads: stream, consumer and subject names, ledger run and batch ids and error texts, and advisories a client
publishes into the capture stream itself (any field, any type). Every HTML answer is parsed: it holds only the
elements and attributes the templates write (nothing from a payload), carries the policy that lets no script run,
and shows each stored payload as text. No answer is a 5xx.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from html.parser import HTMLParser
from urllib.parse import quote

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from airflow_jetstream.client.admin.consumers import ensure_consumer
from airflow_jetstream.client.admin.streams import ensure_stream
from airflow_jetstream.client.advisories import ensure_capture_stream
from airflow_jetstream.client.connection import JetStreamConnection, open_connection
from airflow_jetstream.client.ledger import BatchLedger
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.embedded import EmbeddedNatsServer
from tests.support import jetstream_view as seeded
from tests.support.airflow_cli import nats_conn_json
from tests.support.polling import async_wait_until

CONN = "nats_hostile"
PAGE = f"/jetstream/connections/{CONN}"
API = f"/jetstream/api/connections/{CONN}"
HTML = {"accept": "text/html,application/xhtml+xml"}
#: Generated requests per route and generation mode (4 routes, 2 modes).
EXAMPLES = 25

# Names nats-server accepts (no '.', '*', '>', '/', '\\' or white space) that would open a tag or leave an attribute.
STREAM = "S<b\"onmouseover='alert(1)'&amp"
CONSUMER = "c<img\"src='x'onerror='alert(2)'"
SUBJECT = "hostile.<script>alert(3)</script>"
RUN_ID = "<script>alert('run')</script>"
BATCH_ID = "<img src=x onerror=alert('batch')>"
ERROR_TEXT = "<svg onload=alert('error')>"
ADVISED = {"stream": "<iframe src=javascript:alert(5)>", "consumer": "<a href=javascript:alert(6)>x</a>",
           "batch": "<b onclick=alert(7)>", "reason": "<style>*{display:none}</style>"}
STORED = (STREAM, CONSUMER, SUBJECT, RUN_ID, BATCH_ID, ERROR_TEXT, *ADVISED.values())
# A misbehaving consumer that gave up GIVEN_UP messages, and a read cursor made at a start position.
QUIET, MISBEHAVING, GIVEN_UP = "QUIET", "misbehaving", 5
CURSOR, CURSOR_START = "cursor", 20_001
PAYLOADS = ("<img src=x onerror=alert(1)>", "\"><script>alert(1)</script>", "'onmouseover='alert(1)",
            "javascript:alert(1)")
QUERY = ("ledger_bucket", "capture_stream", "stream", "run_id", "ledger_before", "per_page", "problems_page",
         "streams_page", "consumers_page", "sources_page", "ledger_page", "advisories_page", "format")

# What the templates write: any other element or attribute came from a payload.
TAGS = {"html", "head", "meta", "title", "link", "body", "p", "a", "h1", "h2", "code", "form", "label", "input",
        "button", "section", "table", "thead", "tbody", "tr", "th", "td", "b", "span", "div", "ul", "li"}
ATTRIBUTES = {"lang", "charset", "rel", "href", "class", "id", "title", "method", "action", "name", "value", "type",
              "data-level", "data-kind", "data-problem", "data-section", "data-count", "data-others"}


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parsed(reply) -> _Markup:
    """The answer's markup, after checking it is the templates' own and the policy allows no script."""
    assert reply.status_code < 500, (reply.request.url, reply.status_code, reply.text[:500])
    policy = reply.headers.get("content-security-policy", "")
    assert "default-src 'none'" in policy and "script-src" not in policy and "frame-ancestors 'self'" in policy
    markup = _Markup()
    markup.feed(reply.text)
    markup.close()
    for tag, attrs in markup.tags:
        assert tag in TAGS, (reply.request.url, tag, attrs)
        for name, value in attrs:
            assert name in ATTRIBUTES, (reply.request.url, tag, name, value)
            if name in ("href", "action"):
                assert (value or "").startswith(("?", "/", "#", "connections")), (reply.request.url, tag, value)
    return markup


async def _seed(conn: JetStreamConnection) -> None:
    await ensure_capture_stream(conn)
    await conn.api_request(f"STREAM.CREATE.{STREAM}", {"name": STREAM, "subjects": ["hostile.>"], "storage": "file"})
    await conn.js.publish(SUBJECT, b"{}")
    await conn.api_request(f"CONSUMER.CREATE.{STREAM}.{CONSUMER}", {"stream_name": STREAM, "config": {
        "name": CONSUMER, "durable_name": CONSUMER, "ack_policy": "explicit", "filter_subject": SUBJECT}})
    ledger = await BatchLedger.open(conn, max_attempts=1)
    await ledger.record(RUN_ID, BATCH_ID, stream=STREAM, count=1, first_seq=1, last_seq=1)
    claim = await ledger.claim(RUN_ID, BATCH_ID)
    assert claim is not None
    await ledger.release(claim, error=ERROR_TEXT)
    now = datetime.now(UTC).isoformat()
    forged = [  # what any client may publish on the capture stream's subjects, wrong types included
        ("$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.X", {"type": "io.nats.jetstream.advisory.v1.stream_batch_abandoned",
                                                         "timestamp": now, **ADVISED}),
        ("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.X.Y", {
            "type": "io.nats.jetstream.advisory.v1.max_deliver", "timestamp": now, **ADVISED,
            "stream_seq": "<b>7</b>", "deliveries": {"<i>": 1}}),
        ("$JS.EVENT.ADVISORY.CONSUMER.PAUSE.X.Y", {"type": "io.nats.jetstream.advisory.v1.consumer_pause",
                                                   "timestamp": "<b>not a time</b>", **ADVISED,
                                                   "paused": "<b>yes</b>", "pause_until": ["<i>"]}),
        ("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.X", {"type": "<script>", "timestamp": 12, "leader": "<b>"}),
    ]
    for seq in range(1, GIVEN_UP + 1):  # a misbehaving consumer: one max_deliveries advisory per message given up
        forged.append((f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{QUIET}.{MISBEHAVING}", {
            "type": "io.nats.jetstream.advisory.v1.max_deliver", "timestamp": now, "stream": QUIET,
            "consumer": MISBEHAVING, "stream_seq": seq, "deliveries": 5}))
    for subject, body in forged:
        await conn.js.publish(subject, json.dumps(body).encode())
    await ensure_stream(conn, {"name": QUIET, "subjects": ["quiet.>"]})
    await ensure_consumer(conn, QUIET, {"name": CURSOR, "durable_name": CURSOR, "ack_policy": "explicit",
                                        "deliver_policy": "by_start_sequence", "opt_start_seq": CURSOR_START})

    async def captured() -> bool:
        info = await conn.api_request("STREAM.INFO.ADVISORIES")
        return bool(info["state"]["messages"] >= len(forged))

    await async_wait_until(captured, "the forged advisories in the capture stream")


@pytest.fixture(scope="module")
def airflow_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    server = EmbeddedNatsServer(store_dir=tmp_path_factory.mktemp("nats-hostile")).start()
    try:
        async def seed() -> None:
            async with open_connection(ConnectionSettings(servers=server.url)) as conn:
                await _seed(conn)

        asyncio.run(seed())
        with seeded.mounted_view({CONN: nats_conn_json(server.url)}) as app:
            yield app
    finally:
        server.close()


@pytest.fixture(scope="module")
def admin(airflow_app: FastAPI) -> TestClient:
    return seeded.client(airflow_app, "ADMIN")


def test_stored_names_ids_errors_and_advisories_come_back_as_text(admin: TestClient) -> None:
    for params in ({"per_page": 1000}, {"per_page": 1000, "stream": STREAM}, {"run_id": RUN_ID},
                   {"capture_stream": "ADVISORIES", "advisories_page": 1, "per_page": 2}):
        page = _parsed(admin.get(PAGE, params=params, headers=HTML))
        assert page.tags, params
    everything = _parsed(admin.get(PAGE, params={"per_page": 1000}, headers=HTML))
    text = "".join(everything.text)
    missing = [stored for stored in STORED if stored not in text]
    assert not missing, f"stored payloads not shown as text: {missing}"
    body = admin.get(API, params={"per_page": 1000})
    assert body.status_code == 200, body.text[:500]
    kinds = {problem["kind"] for problem in body.json()["problems"]["problems"]}
    assert {"ledger_failed", "batch_abandoned", "max_deliveries"} <= kinds, kinds


@pytest.mark.parametrize("parameter", QUERY)
def test_every_query_parameter_takes_a_payload_as_text(admin: TestClient, parameter: str) -> None:
    for payload in PAYLOADS:
        _parsed(admin.get(PAGE, params={parameter: payload}, headers=HTML))
        reply = admin.get(API, params={parameter: payload})
        assert reply.status_code < 500 and reply.headers["content-type"] == "application/json", reply.text[:300]
        assert reply.status_code in (200, 400, 422), (parameter, payload, reply.status_code)


def test_the_connection_id_in_the_path_and_the_box_take_a_payload_as_text(admin: TestClient) -> None:
    for payload in PAYLOADS:
        reply = admin.get(f"/jetstream/connections/{quote(payload, safe='')}", headers=HTML)
        page = _parsed(reply)
        if "/" not in payload:  # a '/' (even as %2F) splits the path: Starlette's own 404, in JSON
            assert reply.status_code == 404 and payload in "".join(page.text)  # "connection ... not found", as text
        assert admin.get(f"/jetstream/api/connections/{quote(payload, safe='')}").status_code == 404
        box = admin.get("/jetstream/connections", params={"connection_id": payload}, headers=HTML)
        assert box.status_code == 303 and box.headers["location"].endswith(quote(payload, safe=""))
    _parsed(admin.get("/jetstream/", headers=HTML))


# ------------------------------------------------------------------------------------------ a misbehaving consumer


def test_a_consumer_giving_up_messages_is_one_problem_with_a_count_and_the_newest_time(admin: TestClient) -> None:
    problems = admin.get(API, params={"per_page": 1000}).json()["problems"]["problems"]
    [given_up] = [p for p in problems if p["kind"] == "max_deliveries" and p["object"]["consumer"] == MISBEHAVING]
    assert given_up["count"] == GIVEN_UP and given_up["newest"] >= given_up["since"]
    assert f"gave up on {GIVEN_UP} messages (stream seq {GIVEN_UP}, 4, 3, 2, 1)" in given_up["why"], given_up
    page = admin.get(PAGE, params={"per_page": 1000}, headers=HTML).text
    rows = [row for row in re.findall(r'<tr class="row-error" data-kind="max_deliveries">(.*?)</tr>', page, re.S)
            if MISBEHAVING in row]
    assert len(rows) == 1 and f"<b>x{GIVEN_UP}</b>, newest at" in rows[0], rows


def test_a_cursor_at_a_start_position_shows_nothing_delivered_yet(admin: TestClient) -> None:
    """nats-server reports a consumer made at sequence 20,001 as delivered up to 20,000 with no delivery: the row
    said "delivered seq 20,000" beside "last delivery never"."""
    [row] = [r for r in admin.get(API, params={"per_page": 1000}).json()["consumers"]["consumers"]
             if r["name"] == CURSOR]
    assert (row["delivered_stream_seq"], row["delivered_count"], row["last_active"]) == (CURSOR_START - 1, 0, None)
    page = admin.get(PAGE, params={"per_page": 1000, "stream": QUIET}, headers=HTML).text
    [cells] = re.findall(rf'<tr id="consumer-{QUIET}-{CURSOR}"[^>]*>(.*?)</tr>', page, re.S)
    assert f"none yet, starts after {CURSOR_START - 1:,}" in cells and "never" in cells
    assert f'<td class="n">{CURSOR_START - 1:,}</td>' not in cells


# ------------------------------------------------------------------------------------------ the OpenAPI schema


def test_the_schema_is_served_and_documents_every_answer(admin: TestClient) -> None:
    served = admin.get("/jetstream/openapi.json").json()
    answers = served["paths"]["/api/connections/{connection_id}"]["get"]["responses"]
    assert set(answers) == {"200", "400", "401", "403", "404", "422", "500", "503"}
    assert answers["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/View"}


@pytest.mark.parametrize("mode", list(GenerationMode))
def test_the_json_api_answers_what_its_schema_says(airflow_app: FastAPI, mode: GenerationMode) -> None:
    """Requests generated from the served schema, valid (positive) and not (negative), to every route: no 5xx, and
    every status code, content type and JSON body is one the schema documents. Every other generated connection id
    is the seeded connection, so the view reads NATS for the generated queries. Bounded: a fixed number of examples
    per route, derandomized (the same requests every run)."""
    schema = schemathesis.openapi.from_asgi("/jetstream/openapi.json", airflow_app)
    token = seeded.login_token("ADMIN")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} == {"/", "/connections", "/connections/{connection_id}",
                                              "/api/connections/{connection_id}"}
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def answers_as_documented(case) -> None:
            ids = case.path_parameters or {}
            if "connection_id" in ids and len(str(ids["connection_id"])) % 2 == 0:
                ids["connection_id"] = CONN
            case.call_and_validate(headers={"Authorization": f"Bearer {token}"},
                                   checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                           response_schema_conformance])

        answers_as_documented()
