"""The JetStream view: a FastAPI app the Airflow api-server mounts under ``/jetstream`` (see plugin.py).

    GET /jetstream/                                   nats connections the user may read
    GET /jetstream/connections/{connection_id}        the view (HTML; ``?format=json`` for JSON)
    GET /jetstream/api/connections/{connection_id}    the same as JSON

Status codes say what monitoring needs: 200 when NATS was read (problems are in the body), 503 with the
typed error when NATS cannot be read within ``[jetstream] view_timeout`` (down, stalled, unreachable),
404 for a connection id that does not exist, 400 for a connection of another type or with unusable
settings and for bad names, 422 for malformed query parameters. Every route needs Airflow's login: a
browser without one is sent to Airflow's login page, any other client gets 401 (403 without read access
to the connection), before any NATS work. Reads are async, shared and cached (ui/snapshot.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import asdict, replace
from typing import Annotated, Any
from urllib.parse import quote

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_connection
from airflow.providers.common.compat.sdk import AirflowNotFoundException
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from airflow_jetstream import __version__
from airflow_jetstream.client.advisories.types import DEFAULT_CAPTURE_STREAM
from airflow_jetstream.client.errors import (
    InvalidRequestError,
    InvalidSettingsError,
    JetStreamError,
    RequestTimeoutError,
)
from airflow_jetstream.client.ledger.records import DEFAULT_BUCKET
from airflow_jetstream.client.subjects import validate_name
from airflow_jetstream.ui import pages
from airflow_jetstream.ui.pages import PAGED, PageQuery, shape
from airflow_jetstream.ui.problems import KINDS
from airflow_jetstream.ui.snapshot import ReadCache, ReadKey, ViewSettings, read_snapshot, view_settings

log = logging.getLogger(__name__)


# The JSON the view answers, as OpenAPI models: what ``/jetstream/openapi.json`` documents per status code. They
# describe, they do not build: the routes answer plain dicts (ui/snapshot.py, ui/pages.py) and the suite checks
# every answer against these models (tests/test_ui_hostile.py). Fields a client may rely on are named; rows stay
# open objects (``extra="allow"``), each section's row fields are docs/ui.md's tables.


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TypedError(_Open):
    """A typed error (client/errors.py): ``reason`` is the machine-readable cause, ``message`` says what to do."""

    error: str
    reason: str
    message: str
    code: int | None = None
    err_code: int | None = None


class Detail(BaseModel):
    """A refusal before any NATS work: no login (401), an invalid token or no read access to the connection (403)."""

    detail: Any


class Refusal(BaseModel):
    """A request the view refuses: a name that cannot be one (400), an unknown connection (404), a connection of
    another type or with unusable settings (400), a bad ``[jetstream]`` setting of the deployment (500)."""

    detail: str | None
    error: TypedError


class SectionError(BaseModel):
    """A section that could not be read; the other sections still show."""

    error: TypedError


class _Paged(BaseModel):
    total: int
    shown: int
    first: int
    page: int
    pages: int


class Section(_Open, _Paged):
    """One page of a section's rows (under the section's own key: ``streams``, ``consumers``, ``sources``, ``runs``,
    ``advisories``)."""


class At(BaseModel):
    section: str
    page: int


class Problem(BaseModel):
    kind: Annotated[str, Field(json_schema_extra={"enum": sorted(KINDS)})]
    severity: Annotated[str, Field(json_schema_extra={"enum": ["error", "warning"]})]
    object: dict[str, Any]
    why: str
    since: str | None
    since_means: str | None
    fix: str
    anchor: str
    at: At
    count: int
    newest: str | None


class Problems(_Paged):
    problems: list[Problem]
    errors: int
    warnings: int


class View(_Open):
    """A connection read (200): problems first, then each section (or its error), and the values used."""

    connection_id: str
    servers: list[str]
    ledger_bucket: str
    capture_stream: str
    run_id: str | None
    ledger_before: int | None
    read_at: str
    elapsed_ms: int
    age_s: float
    problems: Problems
    streams: Section | SectionError
    consumers: Section | SectionError
    sources: Section | SectionError
    ledger: Section | SectionError
    advisories: Section | SectionError
    other_streams: list[str]
    focus: dict[str, str | None]
    thresholds: dict[str, float]
    limits: dict[str, float]


class Unavailable(_Open):
    """NATS could not be read within ``view_timeout`` (503, with ``Retry-After``): the typed error, no sections."""

    connection_id: str
    servers: list[str]
    detail: str
    error: TypedError
    age_s: float


#: Every answer of the JSON API by status code (422 is FastAPI's own validation error).
RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": View, "description": "NATS was read; problems are in the body"},
    400: {"model": Refusal, "description": "a name that cannot be one, or a connection of another type"},
    401: {"model": Detail, "description": "no login"},
    403: {"model": Detail, "description": "an invalid token, or no read access to the connection"},
    404: {"model": Refusal, "description": "no such connection"},
    500: {"model": Refusal, "description": "a bad [jetstream] setting of the deployment"},
    503: {"model": Unavailable, "description": "NATS could not be read within view_timeout"},
}


def _either(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/html": {"schema": {"type": "string"}},
                                                    "application/json": {"schema": {"$ref": schema}}}}


#: The page answers the same as HTML (the default) or JSON (``format=json``, or a client not asking for HTML).
PAGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **{code: _either(answer["description"], f"#/components/schemas/{answer['model'].__name__}")
       for code, answer in RESPONSES.items()},
    303: {"description": "a browser without a login: to Airflow's login page, which comes back"},
    422: _either("a malformed query parameter", "#/components/schemas/HTTPValidationError"),
}
#: The index and the connection box.
INDEX_RESPONSES: dict[int | str, dict[str, Any]] = {code: PAGE_RESPONSES[code] for code in (303, 401, 403)}


#: ``nats`` connections listed on the index page (the box opens any other id).
MAX_LISTED_CONNECTIONS = 100
#: Every page load of every connection shares these reads.
CACHE = ReadCache()
#: The trigger event-driven DAGs' asset watchers run (``JetStreamMessageQueueProvider``).
MESSAGE_TRIGGER = "airflow_jetstream.triggers.message.JetStreamMessageTrigger"
DEFAULT_CONN_ID = "nats_default"

app = FastAPI(title="JetStream", description="Read-only view of NATS JetStream for Airflow (docs/ui.md)",
              version=__version__, docs_url=None, redoc_url=None, openapi_url="/openapi.json")

ReadConnection = Depends(requires_access_connection("GET"))
#: Names are checked by the view (ReadKey.check, the focus stream): one that cannot be a name is a 400 naming the rule.
Name = Annotated[str, Query()]
OptionalName = Annotated[str | None, Query()]
PageNumber = Annotated[int, Query(ge=1, le=1_000_000)]
#: On every answer: no script at all (the view has none), styles from the view's stylesheet only, forms back to the
#: api-server, framed only by Airflow's own pages (its UI shows the view in a frame).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'self'; "
                               "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
}


@app.middleware("http")
async def _security_headers(request: Request, call_next: Any) -> Response:
    response: Response = await call_next(request)
    response.headers.update(SECURITY_HEADERS)
    return response


@app.get("/view.css", include_in_schema=False)
async def stylesheet() -> Response:
    """The view's look (no login needed: it holds nothing of a connection); cached, the page links it by version."""
    return Response(pages.stylesheet(), media_type="text/css", headers={"Cache-Control": "public, max-age=86400"})


def _wants_html(request: Request) -> bool:
    return "/api/" not in request.url.path and request.query_params.get("format") != "json" \
        and "text/html" in request.headers.get("accept", "")


@app.exception_handler(HTTPException)
async def _refused(request: Request, exc: HTTPException) -> Response:
    """A browser without a (valid) login goes to Airflow's login page and comes back; other refusals as usual."""
    no_login = exc.status_code == 401 or (exc.status_code == 403 and exc.detail == "Invalid JWT token")
    if no_login and request.method == "GET" and _wants_html(request):
        back = f"{pages.root(request)}{request.url.path.removeprefix(pages.root(request))}"
        back += f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(get_auth_manager().get_url_login(next_url=back), status_code=303)
    headers = getattr(exc, "headers", None)
    if exc.status_code == 403 and _wants_html(request):
        return pages.render(request, "refused.html", status=403, headers=headers, title="Not allowed",
                            error={"reason": "forbidden", "message": str(exc.detail)})
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)


@app.exception_handler(RequestValidationError)
async def _malformed(request: Request, exc: RequestValidationError) -> Response:
    """A malformed query parameter (422): FastAPI's JSON, or for a browser the same as a page."""
    if not _wants_html(request):
        return await request_validation_exception_handler(request, exc)
    message = "; ".join(f"{'.'.join(map(str, error['loc'][1:]))}: {error['msg']}" for error in exc.errors())
    return pages.render(request, "refused.html", status=422, title="Malformed query",
                        error={"reason": "invalid_parameter", "message": message})


def _stored_nats_connections(user: Any) -> list[str]:
    """``nats`` connection ids in the metadata database that ``user`` may read (the first 100)."""
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        ids = session.scalars(select(Connection.conn_id).where(Connection.conn_type == "nats")
                              .order_by(Connection.conn_id).limit(MAX_LISTED_CONNECTIONS)).all()
    auth = get_auth_manager()
    return [cid for cid in ids
            if auth.is_authorized_connection(method="GET", details=ConnectionDetails(conn_id=cid), user=user)]


def event_watchers(connection_id: str) -> dict[str, Any]:
    """The event watchers of ``connection_id``: the message triggers its asset watchers run, their arguments
    decrypted as the triggerer does. One waiting for a stream that does not exist waits without end, so the view
    lists it as a problem. ``{"watchers": [{trigger_id, stream, consumer, names, created}]}``, or ``{"error": ...}``
    when the metadata database cannot be read (the section is then unreadable, the rest of the view still shows)."""
    from airflow.models.asset import AssetWatcherModel
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from cryptography.fernet import InvalidToken
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import lazyload

    try:
        with create_session() as session:
            watchers = []
            # the rows alone: not the task instances and runs Airflow's model loads with a trigger
            for trigger in session.scalars(select(Trigger).where(Trigger.classpath == MESSAGE_TRIGGER)
                                           .options(lazyload("*"))):
                kwargs = trigger.kwargs
                if (kwargs.get("nats_conn_id") or DEFAULT_CONN_ID) != connection_id:
                    continue
                names = session.scalars(select(AssetWatcherModel.name)
                                        .where(AssetWatcherModel.trigger_id == trigger.id)).all()
                watchers.append({"trigger_id": trigger.id, "stream": kwargs.get("stream"),
                                 "consumer": kwargs.get("consumer"), "names": sorted(names),
                                 "created": trigger.created_date.isoformat() if trigger.created_date else None})
    except (SQLAlchemyError, InvalidToken) as exc:  # a database that cannot be read; kwargs under another key
        log.warning("JetStream view: Airflow's trigger table could not be read", exc_info=True)
        return {"error": {"error": type(exc).__name__, "reason": "metadata_unreadable", "code": None,
                          "err_code": None, "message": f"Airflow's trigger table could not be read "
                                                       f"({type(exc).__name__}; the api-server's log has why)"}}
    return {"watchers": watchers}


@app.get("/", response_class=HTMLResponse, responses=INDEX_RESPONSES)
async def index(request: Request, user: GetUserDep) -> HTMLResponse:
    """The list of ``nats`` connections the user may read, and a box for any other id."""
    return pages.render(request, "index.html", title="JetStream",
                        connection_ids=await asyncio.to_thread(_stored_nats_connections, user))


@app.get("/connections", response_class=RedirectResponse, status_code=303, responses=INDEX_RESPONSES)
async def open_connection(request: Request, user: GetUserDep,
                          connection_id: Annotated[str, Query(min_length=1, max_length=250)]) -> RedirectResponse:
    return RedirectResponse(f"{pages.root(request)}/connections/{quote(connection_id, safe='')}", status_code=303)


def _reader(key: ReadKey, view: ViewSettings) -> Any:
    async def read(deadline: float, seen: Any) -> dict[str, Any]:
        from airflow_jetstream.hooks.jetstream import JetStreamHook

        own = await asyncio.to_thread(JetStreamHook(nats_conn_id=key.connection_id).get_settings)
        watchers = await asyncio.to_thread(event_watchers, key.connection_id)
        snapshot = await read_snapshot(key, own, view, seen, deadline=deadline, watchers=watchers)
        problems = snapshot.get("problems") or []
        log.info("JetStream view of %s: %s, %d problem(s) (%d error(s)), read in %d ms", key.connection_id,
                 f"NATS unreadable ({snapshot['error']['reason']})" if "error" in snapshot else "read",
                 len(problems), sum(p["severity"] == "error" for p in problems), snapshot["elapsed_ms"])
        return snapshot

    return read


def _answer(request: Request, status: int, error: dict[str, Any], *, html: bool, view: ViewSettings, title: str,
            headers: dict[str, str] | None = None, body: dict[str, Any] | None = None, **page: Any) -> Response:
    """A read refused or failed: the refusal page (with ``page``'s values) or JSON (``body`` with the error); a 503
    says when to retry."""
    headers = {"Cache-Control": "no-store", **(headers or {})}
    if status == 503:
        headers["Retry-After"] = str(max(1, math.ceil(view.cache_seconds)))
    if html:
        return pages.render(request, "refused.html", status=status, headers=headers, title=title, error=error, **page)
    return JSONResponse({**(body or {}), "detail": error.get("message"), "error": error}, status, headers=headers)


async def _view(request: Request, connection_id: str, key_args: dict[str, Any], page: PageQuery,
                html: bool) -> Response:
    try:
        view = view_settings()
    except InvalidSettingsError as exc:  # the deployment's [jetstream] section, not the request
        return _answer(request, 500, exc.to_dict(), html=html, view=ViewSettings(), title="Bad [jetstream] setting")
    key = ReadKey(connection_id, **key_args)
    try:
        key.check()
        if page.stream is not None:
            validate_name(page.stream, what="stream")
        snapshot, age = await CACHE.get(key, _reader(key, view), ttl=view.cache_seconds,
                                        concurrent=view.concurrent_reads, timeout=view.timeout)
    except (JetStreamError, TimeoutError) as exc:
        if not isinstance(exc, JetStreamError):
            exc = RequestTimeoutError(f"no answer from NATS within the view's {view.timeout:g}s ([jetstream] "
                                      "view_timeout)", reason="view_timeout")
        status = 404 if isinstance(exc, AirflowNotFoundException) \
            else 400 if isinstance(exc, InvalidRequestError | InvalidSettingsError) else 503
        return _answer(request, status, exc.to_dict(), html=html, view=view,
                       title=f"JetStream: connection {connection_id}")
    headers = {"Cache-Control": "no-store", "X-JetStream-Read-Age": f"{age:.1f}"}
    if "error" in snapshot:
        return _answer(request, 503, snapshot["error"], html=html, view=view, title=f"JetStream: {connection_id}",
                       headers=headers, body={**snapshot, "age_s": round(age, 1)}, unavailable=True,
                       connection_id=connection_id, servers=snapshot.get("servers", []))
    limits = asdict(view)
    body = {**shape(snapshot, replace(page, per_page=page.per_page or view.page_size)), "age_s": round(age, 1),
            "thresholds": limits.pop("thresholds"), "limits": limits}
    if html:
        return pages.page(request, body, query=dict(request.query_params), headers=headers)
    return JSONResponse(body, headers=headers)


def _view_request(
    ledger_bucket: Name = DEFAULT_BUCKET,
    capture_stream: Name = DEFAULT_CAPTURE_STREAM,
    stream: OptionalName = None,
    run_id: OptionalName = None,
    ledger_before: Annotated[int | None, Query(ge=1)] = None,
    per_page: Annotated[int | None, Query(ge=1, le=1000)] = None,
    problems_page: PageNumber = 1,
    streams_page: PageNumber = 1,
    consumers_page: PageNumber = 1,
    sources_page: PageNumber = 1,
    ledger_page: PageNumber = 1,
    advisories_page: PageNumber = 1,
) -> tuple[dict[str, Any], PageQuery]:
    """The query parameters: what to read (bucket, capture stream, ledger run or older page) and what to show."""
    numbers = dict(zip(PAGED, (problems_page, streams_page, consumers_page, sources_page, ledger_page,
                               advisories_page), strict=True))
    key = {"ledger_bucket": ledger_bucket, "capture_stream": capture_stream, "run_id": run_id,
           "ledger_before": ledger_before}
    return key, PageQuery(per_page=per_page or 0, stream=stream, pages=numbers)


ViewRequest = Annotated[tuple[dict[str, Any], PageQuery], Depends(_view_request)]


@app.get("/connections/{connection_id}", response_class=HTMLResponse, dependencies=[ReadConnection],
         responses=PAGE_RESPONSES)
async def connection_page(request: Request, connection_id: str, asked: ViewRequest,
                          output: Annotated[str, Query(alias="format", pattern="^(html|json)$")] = "html") -> Response:
    return await _view(request, connection_id, *asked, html=output == "html")


@app.get("/api/connections/{connection_id}", dependencies=[ReadConnection], responses=RESPONSES)
async def connection_json(request: Request, connection_id: str, asked: ViewRequest) -> Response:
    return await _view(request, connection_id, *asked, html=False)
