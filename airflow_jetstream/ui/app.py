"""The JetStream view: a FastAPI app the Airflow api-server mounts under ``/jetstream`` (see plugin.py).

Every route needs Airflow's own login (the UI's session cookie or a ``Bearer`` token, checked by
Airflow's auth manager); a connection's page also needs read access to that connection. Requests are
refused with 401 (no or bad login) or 403 (no access) before any NATS work. Pages only read
(:mod:`airflow_jetstream.ui.snapshot`); nothing on the page or in the JSON is a secret.

    GET /jetstream/                                   nats connections the user may read
    GET /jetstream/connections/{connection_id}        the view (HTML; ``?format=json`` for JSON)
    GET /jetstream/api/connections/{connection_id}    the same snapshot as JSON
"""

from __future__ import annotations

import logging
from typing import Annotated, Any
from urllib.parse import quote

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_connection
from airflow.providers.common.compat.sdk import AirflowNotFoundException
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from airflow_jetstream.client.advisories import DEFAULT_CAPTURE_STREAM
from airflow_jetstream.client.errors import InvalidSubjectError
from airflow_jetstream.client.ledger import DEFAULT_BUCKET
from airflow_jetstream.ui import pages
from airflow_jetstream.ui.snapshot import ViewLimits, check_names, read_snapshot

log = logging.getLogger(__name__)

#: ``nats`` connections listed on the index page (the box opens any other id).
MAX_LISTED_CONNECTIONS = 100
LIMITS = ViewLimits()

app = FastAPI(title="JetStream", description="Read-only view of NATS JetStream for Airflow", docs_url=None,
              redoc_url=None, openapi_url=None)

ReadConnection = Depends(requires_access_connection("GET"))
LedgerBucket = Annotated[str, Query(max_length=256)]
CaptureStream = Annotated[str, Query(max_length=256)]


def _root(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


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


@app.get("/", response_class=HTMLResponse)
def index(request: Request, user: GetUserDep) -> str:
    root = _root(request)
    return pages.index(_stored_nats_connections(user), href=lambda cid: f"{root}/connections/{quote(cid, safe='')}")


@app.get("/connections", response_class=RedirectResponse)
def open_connection(request: Request, user: GetUserDep,
                    connection_id: Annotated[str, Query(min_length=1, max_length=250)]) -> RedirectResponse:
    return RedirectResponse(f"{_root(request)}/connections/{quote(connection_id, safe='')}", status_code=303)


def _snapshot(connection_id: str, ledger_bucket: str, capture_stream: str) -> dict[str, Any]:
    try:
        check_names(ledger_bucket, capture_stream)
    except InvalidSubjectError as exc:
        raise HTTPException(400, exc.message) from None
    try:
        snapshot = read_snapshot(connection_id, ledger_bucket=ledger_bucket, capture_stream=capture_stream,
                                 limits=LIMITS)
    except AirflowNotFoundException:
        raise HTTPException(404, f"connection {connection_id!r} does not exist") from None
    log.info("JetStream view of %s read in %s ms", connection_id, snapshot["elapsed_ms"])
    return snapshot


@app.get("/connections/{connection_id}", response_class=HTMLResponse, dependencies=[ReadConnection])
def connection_page(request: Request, connection_id: str, ledger_bucket: LedgerBucket = DEFAULT_BUCKET,
                    capture_stream: CaptureStream = DEFAULT_CAPTURE_STREAM,
                    output: Annotated[str, Query(alias="format", pattern="^(html|json)$")] = "html") -> Any:
    snapshot = _snapshot(connection_id, ledger_bucket, capture_stream)
    if output == "json":
        return JSONResponse(snapshot)
    return HTMLResponse(pages.page(snapshot, index_href=f"{_root(request)}/"))


@app.get("/api/connections/{connection_id}", dependencies=[ReadConnection])
def connection_json(connection_id: str, ledger_bucket: LedgerBucket = DEFAULT_BUCKET,
                    capture_stream: CaptureStream = DEFAULT_CAPTURE_STREAM) -> dict[str, Any]:
    return _snapshot(connection_id, ledger_bucket, capture_stream)

