"""What one page shows of a read, and its HTML.

Nothing is left out silently: every section says how many rows there are (``total``, after the focus),
which ones this page shows, and how many pages there are; a stream in focus (``?stream=``) narrows every
section to what concerns it. Problems are never narrowed or paged away from their count: each one says
on which page of which section its row is (``at``), so a link reaches it.

The HTML comes from Jinja2 templates shipped beside this module (``templates/``), every value escaped unless a
template says otherwise, no JavaScript; the look is one stylesheet (``static/view.css``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse
from starlette.templating import Jinja2Templates

from airflow_jetstream import __version__
from airflow_jetstream.client.advisories.types import parse_timestamp
from airflow_jetstream.ui.links import row_anchor
from airflow_jetstream.ui.problems import RANK, span

#: Sections with rows and the list key of each.
ROWS: dict[str, str] = {"streams": "streams", "consumers": "consumers", "sources": "sources", "ledger": "runs",
                        "advisories": "advisories"}
PAGED = ("problems", *ROWS)


@dataclass(frozen=True)
class PageQuery:
    """The page asked for: a stream in focus, a page number per section, rows per page."""

    per_page: int
    stream: str | None = None
    pages: dict[str, int] = field(default_factory=dict)

    def page(self, section: str) -> int:
        return max(1, self.pages.get(section, 1))


def _in_focus(section: str, row: dict[str, Any], stream: str) -> bool:
    if section == "streams":
        return bool(row.get("name") == stream)
    if section == "sources":
        return stream in (row.get("stream"), row.get("source"))
    if section == "ledger":
        return stream in (row.get("streams") or [])
    return bool(row.get("stream") == stream)


def _window(rows: list[dict[str, Any]], page: int, per_page: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The rows of ``page`` (the last page when past it) and where they are: total, shown, first, page, pages."""
    pages = max(1, -(-len(rows) // per_page))
    page = min(page, pages)
    shown = rows[(page - 1) * per_page: page * per_page]
    return shown, {"total": len(rows), "shown": len(shown), "first": (page - 1) * per_page + 1 if shown else 0,
                   "page": page, "pages": pages}


def shape(snapshot: dict[str, Any], query: PageQuery) -> dict[str, Any]:
    """The read as this page shows it: each section's ``rows`` (with ``anchor`` and ``problem``), ``total``,
    ``first`` (1-based index of the first row shown), ``page``, ``pages``; ``problems`` with ``at`` (section and
    page of the row each names, without focus); ``other_streams``: streams not on this page of the streams table."""
    problems = snapshot.get("problems") or []
    worst: dict[str, int] = {}
    for problem in problems:
        worst[problem["anchor"]] = min(worst.get(problem["anchor"], 9), RANK[problem["severity"]])
    out = {key: value for key, value in snapshot.items() if key not in ROWS and key != "problems"}
    located: dict[str, dict[str, Any]] = {}
    for section, key in ROWS.items():
        data = snapshot.get(section)
        if data is None or "error" in data:
            out[section] = data
            continue
        rows = [{**row, "anchor": row_anchor(section, row)} for row in data.get(key) or []]
        rows.sort(key=lambda r: worst.get(r["anchor"], 9))  # stable: the section's own order within a rank
        for index, row in enumerate(rows):
            row["problem"] = {0: "error", 1: "warning"}.get(worst.get(row["anchor"], 9))
            located.setdefault(row["anchor"], {"section": section, "page": index // query.per_page + 1})
        if query.stream is not None:
            rows = [row for row in rows if _in_focus(section, row, query.stream)]
        shown, where = _window(rows, query.page(section), query.per_page)
        out[section] = {**{k: v for k, v in data.items() if k != key}, key: shown, **where}
        if section == "streams":
            names = {row["name"] for row in shown}
            out["other_streams"] = sorted(row["name"] for row in rows if row["name"] not in names) \
                if query.stream is None else []
            out[section]["exist"] = data.get("total", len(rows))
    listed = [{**p, "at": located.get(p["anchor"], {"section": p["anchor"].removeprefix("section-"), "page": 1})}
              for p in problems]
    shown, where = _window(listed, query.page("problems"), query.per_page)
    out["problems"] = {"problems": shown, **where, "errors": sum(p["severity"] == "error" for p in listed),
                       "warnings": sum(p["severity"] == "warning" for p in listed)}
    out["focus"] = {"stream": query.stream}
    return out


#: Advisory kinds that are problems when recent (shown in red in the advisory table).
PROBLEM_ADVISORIES = ("batch_abandoned", "max_deliveries", "msg_terminated", "stream_quorum_lost",
                      "consumer_quorum_lost", "server_out_of_storage", "api_limit_reached")
#: An advisory row's fields shown as its detail, and the fields of a problem's object that name it.
DETAIL_FIELDS = ("batch", "reason", "stream_seq", "deliveries", "action", "leader", "paused", "pause_until", "domain")
OBJECT_NAMES = ("stream", "consumer", "source", "run_id", "batch", "capture_seq", "section", "name")


#: The units of :func:`size`, each 1024 times the one before.
SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def num(value: Any) -> str:
    return f"{int(value):,}" if value is not None else "-"


def size(value: Any) -> str:
    """Bytes in binary units, short below a KiB too: ``512 B``, ``1.5 KiB``, ``2.0 GiB``."""
    amount, step = float(value), 0
    while amount >= 1024 and step < len(SIZE_UNITS) - 1:
        amount, step = amount / 1024, step + 1
    return f"{int(amount)} B" if step == 0 else f"{amount:.1f} {SIZE_UNITS[step]}"


def utc_and_ago(iso: str | None) -> str:
    """``2026-11-27 12:18:21 UTC, 5 min ago`` (empty for no time)."""
    when = parse_timestamp(iso)
    if when is None:
        return ""
    since = max(0.0, (datetime.now(UTC) - when).total_seconds())
    return f"{when.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC, {span(since)} ago"


def href(query: Mapping[str, Any], changes: Mapping[str, Any]) -> str:
    """``?query`` with ``changes`` (None removes a parameter)."""
    merged = {**query, **changes}
    return "?" + urlencode({k: v for k, v in merged.items() if v is not None})


@cache
def templates() -> Jinja2Templates:
    env = jinja2.Environment(loader=jinja2.PackageLoader("airflow_jetstream.ui", "templates"), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=num, size=size, span=span, utc_and_ago=utc_and_ago,
                       quote_part=lambda s: quote(str(s), safe=""),
                       state_title=lambda state: state.replace("_", " ").capitalize(),
                       stream_anchor=lambda name: row_anchor("streams", {"name": name}))
    env.globals.update(href=href, problem_advisories=PROBLEM_ADVISORIES, detail_fields=DETAIL_FIELDS,
                       object_fields=OBJECT_NAMES, version=__version__)
    return Jinja2Templates(env=env)


@cache
def stylesheet() -> str:
    return files("airflow_jetstream.ui").joinpath("static", "view.css").read_text(encoding="utf-8")


def root(request: Request) -> str:
    """Where the app is mounted (``/jetstream`` below the api-server's own path)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def render(request: Request, template: str, *, status: int = 200, headers: Mapping[str, str] | None = None,
           **context: Any) -> HTMLResponse:
    """``template`` with ``context`` (plus ``root``) as an HTML response."""
    return templates().TemplateResponse(request, template, {"root": root(request), **context}, status_code=status,
                                        headers=headers)


def page(request: Request, view: dict[str, Any], *, query: Mapping[str, Any],
         headers: Mapping[str, str]) -> HTMLResponse:
    """The view of one connection: problems first, then streams, consumers, sources, ledger, advisories."""
    return render(request, "connection.html", headers=headers, title=f"JetStream: {view['connection_id']}",
                  view=view, server=view.get("server") or {}, query=query,
                  unfocused={k: v for k, v in query.items() if k != "stream" and not k.endswith("_page")},
                  unpaged={k: v for k, v in query.items() if not k.endswith("_page")},
                  reading={k: v for k, v in query.items() if k in ("ledger_bucket", "capture_stream")})

