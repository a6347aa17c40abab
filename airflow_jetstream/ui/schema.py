"""The JSON the view answers, as OpenAPI models: what ``/jetstream/openapi.json`` documents per status code.

They describe, they do not build: the routes answer plain dicts (ui/snapshot.py, ui/paging.py) and the suite
checks every answer against these models (tests/test_ui_fuzz.py). Fields a client may rely on are named;
rows stay open objects (``extra="allow"``), each section's row fields are docs/ui.md's tables.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from airflow_jetstream.ui.problems import KINDS


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
