"""What one page shows of a read: a stream in focus, rows worst first, one page per section, where each row is.

Nothing is left out silently: every section says how many rows there are (``total``, after the focus),
which ones this page shows, and how many pages there are; a stream in focus (``?stream=``) narrows every
section to what concerns it. Problems are never narrowed or paged away from their count: each one says
on which page of which section its row is (``at``), so a link reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_jetstream.ui.problems import anchor

#: Sections with rows, the list key of each, and the anchor of a row.
ROWS: dict[str, str] = {"streams": "streams", "consumers": "consumers", "sources": "sources", "ledger": "runs",
                        "advisories": "advisories"}
PAGED = ("problems", *ROWS)
_RANK = {"error": 0, "warning": 1}


def row_anchor(section: str, row: dict[str, Any]) -> str:
    """The element id of a row (what a problem's ``anchor`` and a link's ``#...`` name)."""
    names: dict[str, tuple[Any, ...]] = {
        "streams": ("stream", row.get("name")),
        "consumers": ("consumer", row.get("stream"), row.get("name")),
        "sources": ("source", row.get("stream"), row.get("source")),
        "ledger": ("run", row.get("run_id")),
        "advisories": ("advisory", row.get("capture_seq")),
    }
    return anchor(*names[section])


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
        worst[problem["anchor"]] = min(worst.get(problem["anchor"], 9), _RANK[problem["severity"]])
    out = {key: value for key, value in snapshot.items() if key not in ROWS and key != "problems"}
    located: dict[str, dict[str, Any]] = {}
    for section, key in ROWS.items():
        data = snapshot.get(section)
        if data is None or "error" in data:
            out[section] = data
            continue
        rows = [{**row, "anchor": row_anchor(section, row)} for row in data.get(key) or []]
        for index, row in enumerate(sorted(rows, key=lambda r: worst.get(r["anchor"], 9))):
            row["problem"] = {0: "error", 1: "warning"}.get(worst.get(row["anchor"], 9))
            located.setdefault(row["anchor"], {"section": section, "page": index // query.per_page + 1})
        rows.sort(key=lambda r: worst.get(r["anchor"], 9))  # stable: the section's own order within a rank
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
