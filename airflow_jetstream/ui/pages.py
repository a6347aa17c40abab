"""Server-rendered HTML of the JetStream view (no JavaScript, every value escaped)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.2rem;color:#1a202c;font-size:14px}
h1{font-size:1.35rem;margin:0 0 .3rem}h2{font-size:1.1rem;margin:1.6rem 0 .4rem}
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #e2e8f0;padding:.3rem .5rem;
text-align:left;vertical-align:top}th{background:#f7fafc;font-weight:600}td.n{text-align:right;
font-variant-numeric:tabular-nums}.meta{color:#4a5568}.ok{color:#276749}.bad{color:#c53030;font-weight:600}
.warn{color:#b7791f}.note{color:#4a5568;font-style:italic;margin:.3rem 0}.error{background:#fff5f5;
border:1px solid #feb2b2;padding:.5rem;margin:.4rem 0}code{font-size:.9em}form{margin:.6rem 0}
input{padding:.2rem .4rem;margin-right:.4rem}a{color:#2b6cb0}
"""

Column = tuple[str, Callable[[dict[str, Any]], str], bool]  # header, cell html, numeric


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def _num(value: Any) -> str:
    return f"{int(value):,}" if value is not None else "-"


def _bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"


def _flag(good: bool, yes: str, no: str) -> str:
    return f'<span class="{"ok" if good else "bad"}">{_e(yes if good else no)}</span>'


def anchor(kind: str, *names: str) -> str:
    """The element id of a row: ``stream-ORDERS``, ``consumer-ORDERS-worker``."""
    return "-".join([kind, *(quote(name, safe="") for name in names)])


def _table(section: str, rows: Iterable[dict[str, Any]], columns: Sequence[Column],
           row_id: Callable[[dict[str, Any]], str]) -> str:
    head = "".join(f"<th>{_e(title)}</th>" for title, _, _ in columns)
    body = []
    for row in rows:
        cells = "".join(f'<td class="n">{cell(row)}</td>' if numeric else f"<td>{cell(row)}</td>"
                        for _, cell, numeric in columns)
        body.append(f'<tr id="{_e(row_id(row))}">{cells}</tr>')
    if not body:
        return f'<p class="note" data-section="{section}">none</p>'
    return f'<table data-section="{section}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _error(data: dict[str, Any]) -> str:
    err = data["error"]
    return f'<div class="error"><b>{_e(err.get("reason"))}</b>: {_e(err.get("message"))}</div>'


def _truncated(data: dict[str, Any], shown: int, what: str) -> str:
    if not data.get("truncated"):
        return ""
    total = data.get("total")
    of = f" of {_num(total)}" if total is not None else ""
    return f'<p class="note">showing the first {_num(shown)}{of} {what} (the view reads a bounded amount)</p>'


def _replicas(row: dict[str, Any]) -> str:
    if not row["replicas"]:
        return '<span class="meta">single server</span>' if row["leader"] is None else _flag(True, "leader only", "")
    peers = ", ".join(
        f'{_e(p["name"])}: ' + ("offline" if p["offline"] else "current" if p["current"] else f'lag {_num(p["lag"])}')
        for p in row["replicas"])
    return f'{_flag(row["healthy"], "healthy", "unhealthy")} <span class="meta">({peers})</span>'


_STREAM_COLUMNS: list[Column] = [
    ("Stream", lambda r: f"<b>{_e(r['name'])}</b>", False),
    ("Subjects", lambda r: _e(", ".join(r["subjects"][:5]) + (" ..." if len(r["subjects"]) > 5 else "")), False),
    ("Messages", lambda r: _num(r["messages"]), True),
    ("Bytes", lambda r: _bytes(r["bytes"]), True),
    ("Last seq", lambda r: _num(r["last_seq"]), True),
    ("Replicas", lambda r: _num(r["num_replicas"]), True),
    ("Leader", lambda r: _e(r["leader"] or "-"), False),
    ("Replica health", _replicas, False),
    ("Consumers", lambda r: _num(r["consumer_count"]), True),
    ("Sources", lambda r: _e(", ".join(r["sources"]) or (f"mirror of {r['mirror']}" if r["mirror"] else "-")), False),
]

_CONSUMER_COLUMNS: list[Column] = [
    ("Stream", lambda r: _e(r["stream"]), False),
    ("Consumer", lambda r: f"<b>{_e(r['name'])}</b>" + ("" if r["durable"] else ' <span class="meta">ephemeral</span>'),
     False),
    ("Filter", lambda r: _e(", ".join(r["filter_subjects"]) or "-"), False),
    ("Pending", lambda r: _num(r["num_pending"]), True),
    ("Ack pending", lambda r: _num(r["num_ack_pending"]), True),
    ("Redelivered", lambda r: _num(r["num_redelivered"]), True),
    ("Waiting pulls", lambda r: _num(r["num_waiting"]), True),
    ("Delivered seq", lambda r: _num(r["delivered_stream_seq"]), True),
    ("Ack floor", lambda r: _num(r["ack_floor_stream_seq"]), True),
    ("Last active", lambda r: _e(r["last_active"] or "never"), False),
    ("Paused", lambda r: f'<span class="warn">until {_e(r["pause_until"])}</span>' if r["paused"] else "no", False),
]

_SOURCE_COLUMNS: list[Column] = [
    ("Stream", lambda r: _e(r["stream"]), False),
    ("Source", lambda r: f"<b>{_e(r['source'])}</b>" + (' <span class="meta">mirror</span>' if r.get("mirror") else ""),
     False),
    ("Consumer", lambda r: _e(r.get("consumer") or "-"), False),
    ("Lag", lambda r: _num(r["lag"]), True),
    ("Consumer pending", lambda r: _num(r.get("consumer_num_pending")), True),
    ("Ack pending", lambda r: _num(r.get("consumer_num_ack_pending")), True),
    ("Active", lambda r: _flag(r["active"] >= 0, "yes", "no"), False),
    ("Caught up", lambda r: _flag(r["caught_up"], "yes", "no"), False),
    ("Error", lambda r: _e((r.get("error") or {}).get("message") or "-"), False),
]

_ADVISORY_COLUMNS: list[Column] = [
    ("Seq", lambda r: _num(r["capture_seq"]), True),
    ("Time", lambda r: _e(r["timestamp"] or "-"), False),
    ("Kind", lambda r: f"<b>{_e(r['kind'] or r['type'])}</b>", False),
    ("Stream", lambda r: _e(r.get("stream") or "-"), False),
    ("Consumer", lambda r: _e(r.get("consumer") or "-"), False),
    ("Detail", lambda r: _e(", ".join(f"{k}={r[k]}" for k in ("reason", "batch_id", "action", "leader", "deliveries")
                                      if k in r) or "-"), False),
]


def _ledger_columns(states: Sequence[str]) -> list[Column]:
    return [
        ("Run", lambda r: f"<b>{_e(r['run_id'])}</b>", False),
        ("Batches", lambda r: _num(r["batches"]), True),
        *((state.replace("_", " ").capitalize(), lambda r, s=state: _num(r["states"].get(s, 0)), True)
          for state in states),
        ("Messages", lambda r: _num(r["messages"]), True),
        ("Attempts", lambda r: _num(r["attempts"]), True),
        ("Max attempts", lambda r: _num(r["max_attempts"]), True),
        ("Streams", lambda r: _e(", ".join(r["streams"])), False),
        ("Updated", lambda r: _e(r["updated_at"] or "-"), False),
        ("Failed batches", lambda r: _e(", ".join(f"{f['batch_id']} ({f['last_error']})" for f in r["failed"][:5])
                                        or "-"), False),
    ]


def _section(title: str, data: dict[str, Any] | None, body: Callable[[dict[str, Any]], str]) -> str:
    if data is None:
        return ""
    content = _error(data) if "error" in data else body(data)
    return f"<h2>{title}</h2>{content}"


def page(snapshot: dict[str, Any], *, index_href: str) -> str:
    """The view of one connection."""
    conn_id = snapshot["connection_id"]
    parts = [f'<p><a href="{_e(index_href)}">All connections</a></p>',
             f"<h1>JetStream: connection <code>{_e(conn_id)}</code></h1>",
             f'<p class="meta">servers {_e(", ".join(snapshot.get("servers", [])) or "-")} &middot; read in '
             f'{_num(snapshot.get("elapsed_ms"))} ms &middot; read-only</p>']
    query = urlencode({"ledger_bucket": snapshot["ledger_bucket"], "capture_stream": snapshot["capture_stream"]})
    parts.append(
        '<form method="get">'
        f'<label>Ledger bucket <input name="ledger_bucket" value="{_e(snapshot["ledger_bucket"])}"></label>'
        f'<label>Capture stream <input name="capture_stream" value="{_e(snapshot["capture_stream"])}"></label>'
        f'<button type="submit">Refresh</button> <a href="?{_e(query)}&amp;format=json">JSON</a></form>')
    if "error" in snapshot:
        parts.append(_error(snapshot))
    parts.append(_section("Streams", snapshot.get("streams"), lambda d: _table(
        "streams", d["streams"], _STREAM_COLUMNS, lambda r: anchor("stream", r["name"]))
        + _truncated(d, len(d["streams"]), "streams")))
    parts.append(_section("Consumers", snapshot.get("consumers"), lambda d: _table(
        "consumers", d["consumers"], _CONSUMER_COLUMNS, lambda r: anchor("consumer", r["stream"], r["name"]))
        + _truncated(d, len(d["consumers"]), "consumers")))
    parts.append(_section("Durable sources", snapshot.get("sources"), lambda d: _table(
        "sources", d["sources"], _SOURCE_COLUMNS, lambda r: anchor("source", r["stream"], r["source"]))
        + _truncated(d, len(d["sources"]), "sources")))
    ledger = snapshot.get("ledger")
    states = list(ledger["runs"][0]["states"]) if ledger and ledger.get("runs") else []
    parts.append(_section(f"Batch ledger <code>{_e(snapshot['ledger_bucket'])}</code>", ledger, lambda d: _table(
        "ledger", d["runs"], _ledger_columns(states), lambda r: anchor("run", r["run_id"]))
        + (f'<p class="note">read the first {_num(d["keys_read"])} ledger keys only</p>' if d["truncated"] else "")))
    parts.append(_section(f"Recent advisories <code>{_e(snapshot['capture_stream'])}</code>",
                          snapshot.get("advisories"), lambda d: _table(
        "advisories", d["advisories"], _ADVISORY_COLUMNS, lambda r: anchor("advisory", str(r["capture_seq"])))
        + (f'<p class="note">{_num(d["api_audit_skipped"])} API audit advisories not listed</p>'
           if d.get("api_audit_skipped") else "")
        + (f'<p class="note">read the last {_num(d["limit"])} of {_num(d["messages"])} captured</p>'
           if d["truncated"] else "")))
    return _document(f"JetStream: {conn_id}", "".join(parts))


def index(connection_ids: Sequence[str], *, href: Callable[[str], str]) -> str:
    """The list of ``nats`` connections the user may read, and a box for any other id."""
    items = "".join(f'<li><a href="{_e(href(cid))}">{_e(cid)}</a></li>' for cid in connection_ids)
    body = ("<h1>JetStream</h1><p class=\"meta\">Streams, consumers, durable sources, the batch ledger and "
            "captured advisories of a <code>nats</code> connection (read-only).</p>"
            f"<ul>{items or '<li class=note>no nats connection stored in the metadata database</li>'}</ul>"
            '<form method="get" action="connections"><label>Connection id <input name="connection_id" '
            'value="nats_default"></label><button type="submit">Open</button></form>')
    return _document("JetStream", body)


def _document(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{_STYLE}</style></head><body>{body}</body></html>")
