"""The view's tables: columns per section, rows marked by their worst problem, "showing N of M" and pagers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode

Column = tuple[str, Callable[[dict[str, Any]], str], bool]  # header, cell html, numeric
#: Advisory kinds that are problems when recent (shown in red in the advisory table).
PROBLEM_ADVISORIES = ("batch_abandoned", "max_deliveries", "msg_terminated", "stream_quorum_lost",
                      "consumer_quorum_lost", "server_out_of_storage", "api_limit_reached")


def e(value: Any) -> str:
    """Escaped text (None as empty)."""
    return escape("" if value is None else str(value))


def num(value: Any) -> str:
    return f"{int(value):,}" if value is not None else "-"


def size(value: int) -> str:
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{value} B"


def flag(good: bool, yes: str, no: str) -> str:
    return f'<span class="{"ok" if good else "bad"}">{e(yes if good else no)}</span>'


def badge(severity: str | None) -> str:
    if severity is None:
        return ""
    return f'<span class="badge {severity}">{"error" if severity == "error" else "warning"}</span> '


def href(query: Mapping[str, Any], **changes: Any) -> str:
    """``?query`` with ``changes`` (None removes a parameter)."""
    merged = {**query, **changes}
    return "?" + urlencode({k: v for k, v in merged.items() if v is not None})


def pager(section: str, data: dict[str, Any], query: Mapping[str, Any], what: str) -> str:
    """``showing 51-100 of 230 <what>`` and links to the other pages."""
    total, first, rows = data["total"], data["first"], data["shown"]
    text = f"showing {num(first)}-{num(first + rows - 1)} of {num(total)} {what}" if rows else \
        f"showing 0 of {num(total)} {what}"
    if data["pages"] <= 1:
        return f'<p class="count" data-count="{section}">{text}</p>'
    key = f"{section}_page"
    links = []
    for number in sorted({1, data["page"] - 1, data["page"], data["page"] + 1, data["pages"]}):
        if 1 <= number <= data["pages"]:
            label = e(number)
            links.append(f"<b>{label}</b>" if number == data["page"]
                         else f'<a href="{e(href(query, **{key: number}))}#section-{section}">{label}</a>')
    return f'<p class="count" data-count="{section}">{text} &middot; page {" ".join(links)}</p>'


def table(section: str, rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """Rows marked with their worst problem (class and badge), in the order given."""
    head = "".join(f"<th>{e(title)}</th>" for title, _, _ in columns)
    body = []
    for row in rows:
        cells = []
        for index, (_, cell, numeric) in enumerate(columns):
            content = (badge(row.get("problem")) if index == 0 else "") + cell(row)
            cells.append(f'<td class="n">{content}</td>' if numeric else f"<td>{content}</td>")
        marked = f' class="row-{row["problem"]}" data-problem="{row["problem"]}"' if row.get("problem") else ""
        body.append(f'<tr id="{e(row["anchor"])}"{marked}>{"".join(cells)}</tr>')
    if not body:
        return f'<p class="note" data-section="{section}">none</p>'
    return f'<table data-section="{section}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _replicas(row: dict[str, Any]) -> str:
    if not row["replicas"]:
        return '<span class="meta">single server</span>' if row["leader"] is None else flag(True, "leader only", "")
    peers = ", ".join(
        f'{e(p["name"])}: ' + ("offline" if p["offline"] else "current" if p["current"] else f'lag {num(p["lag"])}')
        for p in row["replicas"])
    return f'{flag(row["healthy"], "healthy", "unhealthy")} <span class="meta">({peers})</span>'


STREAMS: list[Column] = [
    ("Stream", lambda r: f"<b>{e(r['name'])}</b>", False),
    ("Subjects", lambda r: e(", ".join(r["subjects"][:5]) + (" ..." if len(r["subjects"]) > 5 else "")), False),
    ("Messages", lambda r: num(r["messages"]), True),
    ("Bytes", lambda r: size(r["bytes"]), True),
    ("Last seq", lambda r: num(r["last_seq"]), True),
    ("Replicas", lambda r: num(r["num_replicas"]), True),
    ("Leader", lambda r: e(r["leader"] or "-"), False),
    ("Replica health", _replicas, False),
    ("Consumers", lambda r: num(r["consumer_count"]), True),
    ("Sources", lambda r: e(", ".join(r["sources"]) or (f"mirror of {r['mirror']}" if r["mirror"] else "-")), False),
]

CONSUMERS: list[Column] = [
    ("Stream", lambda r: e(r["stream"]), False),
    ("Consumer", lambda r: f"<b>{e(r['name'])}</b>" + ("" if r["durable"] else ' <span class="meta">ephemeral</span>'),
     False),
    ("Filter", lambda r: e(", ".join(r["filter_subjects"]) or "-"), False),
    ("Pending", lambda r: num(r["num_pending"]), True),
    ("Ack pending", lambda r: num(r["num_ack_pending"]), True),
    ("Redelivered", lambda r: num(r["num_redelivered"]), True),
    ("Waiting pulls", lambda r: num(r["num_waiting"]) if r["pull"] else '<span class="meta">push</span>', True),
    ("Delivered seq", lambda r: num(r["delivered_stream_seq"]), True),
    ("Ack floor", lambda r: num(r["ack_floor_stream_seq"]), True),
    ("Last delivery", lambda r: e(r["last_active"] or "never"), False),
    ("Last ack", lambda r: e(r["last_ack"] or "never"), False),
    ("Paused", lambda r: f'<span class="warn">until {e(r["pause_until"])}</span>' if r["paused"] else "no", False),
]

SOURCES: list[Column] = [
    ("Stream", lambda r: e(r["stream"]), False),
    ("Source", lambda r: f"<b>{e(r['source'])}</b>" + (' <span class="meta">mirror</span>' if r.get("mirror") else ""),
     False),
    ("Kind", lambda r: e(r.get("kind")), False),
    ("Consumer", lambda r: e(r.get("consumer") or "-"), False),
    ("Lag", lambda r: num(r["lag"]), True),
    ("Consumer pending", lambda r: num(r.get("consumer_num_pending")), True),
    ("Ack pending", lambda r: num(r.get("consumer_num_ack_pending")), True),
    ("Last activity", lambda r: f"{r['active_s']:.1f} s ago" if r.get("active_s") is not None
     else flag(False, "", "inactive"), False),
    ("Caught up", lambda r: flag(r["caught_up"], "yes", "no"), False),
    ("Error", lambda r: e((r.get("error") or {}).get("message") or "-"), False),
]


def _detail(row: dict[str, Any]) -> str:
    names = ("batch", "reason", "stream_seq", "deliveries", "action", "leader", "paused", "pause_until", "domain")
    return e(", ".join(f"{name}={row[name]}" for name in names if name in row) or "-")


ADVISORIES: list[Column] = [
    ("Seq", lambda r: num(r["capture_seq"]), True),
    ("Time", lambda r: e(r["timestamp"] or "-"), False),
    ("Kind", lambda r: f'<b class="{"bad" if r["kind"] in PROBLEM_ADVISORIES else ""}">{e(r["kind"] or r["type"])}</b>',
     False),
    ("Stream", lambda r: e(r.get("stream") or "-"), False),
    ("Consumer", lambda r: e(r.get("consumer") or "-"), False),
    ("Detail", _detail, False),
]


def _run_cell(row: dict[str, Any], query: Mapping[str, Any]) -> str:
    link = href({k: v for k, v in query.items() if k in ("ledger_bucket", "capture_stream")}, run_id=row["run_id"])
    return f'<b><a href="{e(link)}#{e(row["anchor"])}">{e(row["run_id"])}</a></b>'


def _batches(items: list[dict[str, Any]], count: int, text: Callable[[dict[str, Any]], str]) -> str:
    shown = ", ".join(text(item) for item in items[:5])
    return e(shown + (f" ... ({count} in all)" if count > 5 else "")) or "-"


def ledger_columns(states: Sequence[str], query: Mapping[str, Any]) -> list[Column]:
    return [
        ("Run", lambda r: _run_cell(r, query), False),
        ("Batches", lambda r: num(r["batches"]), True),
        *((state.replace("_", " ").capitalize(), lambda r, s=state: num(r["states"].get(s, 0)), True)
          for state in states),
        ("Messages", lambda r: num(r["messages"]), True),
        ("Attempts", lambda r: num(r["attempts"]), True),
        ("Max attempts", lambda r: num(r["max_attempts"]), True),
        ("Streams", lambda r: e(", ".join(r["streams"])), False),
        ("Updated", lambda r: e(r["updated_at"] or "-"), False),
        ("Failed batches", lambda r: _batches(r["failed"], r["failed_count"],
                                              lambda f: f"{f['batch_id']} ({f['last_error']})"), False),
        ("Past visibility deadline", lambda r: _batches(r["overdue"], r["overdue_count"],
                                                        lambda f: f"{f['batch_id']} (since {f['deadline']})"), False),
    ]
