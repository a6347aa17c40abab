"""Server-rendered HTML of the JetStream view (no JavaScript, every value escaped): problems first, then sections."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from airflow_jetstream.client.advisories.types import parse_timestamp
from airflow_jetstream.ui import tables
from airflow_jetstream.ui.paging import row_anchor
from airflow_jetstream.ui.problems import Thresholds
from airflow_jetstream.ui.tables import e, href, num

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.2rem;color:#1a202c;font-size:14px}
h1{font-size:1.35rem;margin:0 0 .3rem}h2{font-size:1.1rem;margin:1.6rem 0 .4rem}
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #e2e8f0;padding:.3rem .5rem;
text-align:left;vertical-align:top}th{background:#f7fafc;font-weight:600}td.n{text-align:right;
font-variant-numeric:tabular-nums}.meta{color:#4a5568}.ok{color:#276749}.bad{color:#c53030;font-weight:600}
.warn{color:#b7791f}.note{color:#4a5568;font-style:italic;margin:.3rem 0}.count{color:#4a5568;margin:.3rem 0}
.error{background:#fff5f5;border:1px solid #feb2b2;padding:.5rem;margin:.4rem 0}code{font-size:.9em}
form{margin:.6rem 0}input{padding:.2rem .4rem;margin-right:.4rem}a{color:#2b6cb0}
tr.row-error{background:#fff5f5}tr.row-warning{background:#fffaf0}
.badge{display:inline-block;border-radius:3px;padding:0 .35rem;font-size:.8em;font-weight:600;color:#fff}
.badge.error{background:#c53030}.badge.warning{background:#b7791f}
.summary{border-radius:4px;padding:.5rem .8rem;margin:.8rem 0}.summary h2{margin:.2rem 0 .4rem}
.summary.error{background:#fff5f5;border:2px solid #c53030}.summary.warning{background:#fffaf0;
border:2px solid #b7791f}.summary.ok{background:#f0fff4;border:2px solid #276749}
.others a{margin-right:.6rem}
"""


def _error(err: Mapping[str, Any]) -> str:
    return f'<div class="error"><b>{e(err.get("reason"))}</b>: {e(err.get("message"))}</div>'


def _ago(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    return f"{seconds // 60} min" if seconds < 7200 else f"{seconds // 3600} h"


def _when(iso: str | None) -> str:
    """``2026-11-27 12:18:21 UTC, 5 min ago`` (the exact time in the element's title)."""
    when = parse_timestamp(iso)
    if when is None:
        return "-"
    ago = max(0.0, (datetime.now(UTC) - when).total_seconds())
    return (f'<span title="{e(iso)}">{e(when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"))} UTC, '
            f"{e(_ago(ago))} ago</span>")


def _checked(limits: Thresholds) -> str:
    return (f"Checked: abandoned batches, given-up and terminated messages in the last {_ago(limits.advisory_age)} "
            f"of captured advisories; consumers with at least {limits.redelivered} redelivered message(s), "
            f"acknowledgements overdue past ack_wait, pending with nobody pulling for {_ago(limits.pending_idle)}, "
            f"paused; sources with an error, inactive, or a backlog not shrinking for {_ago(limits.source_stalled)}; "
            "streams without a leader or with replicas offline or behind; ledger runs with failed batches or claims "
            "past their visibility deadline. Thresholds: Airflow's [jetstream] section (docs/ui.md).")


def problems_summary(data: dict[str, Any], query: Mapping[str, Any], limits: Thresholds) -> str:
    """The box at the top: how many errors and warnings, then one row per problem, worst first."""
    errors, warnings = data["errors"], data["warnings"]
    level = "error" if errors else "warning" if warnings else "ok"
    title = "No problems found" if level == "ok" else \
        f"Problems: {num(errors)} error(s), {num(warnings)} warning(s)"
    unfocused = {k: v for k, v in query.items() if k != "stream" and not k.endswith("_page")}
    rows = []
    for problem in data["problems"]:
        at = problem["at"]
        link = href(unfocused, **{f"{at['section']}_page": at["page"] if at["page"] > 1 else None})
        obj = problem["object"]
        names = " / ".join(str(obj[k]) for k in ("stream", "consumer", "source", "run_id", "batch", "capture_seq",
                                                "section", "name") if obj.get(k) is not None)
        since = _when(problem["since"]) + (f' <span class="meta">({e(problem["since_means"])})</span>'
                                           if problem.get("since_means") else "")
        rows.append(
            f'<tr class="row-{problem["severity"]}" data-kind="{e(problem["kind"])}">'
            f'<td>{tables.badge(problem["severity"])}</td><td><b>{e(problem["kind"])}</b></td>'
            f'<td><a href="{e(link)}#{e(problem["anchor"])}">{e(obj["type"])} {e(names)}</a></td>'
            f'<td>{e(problem["why"])}</td><td>{since}</td><td>{e(problem["fix"])}</td></tr>')
    body = ("<table data-section=\"problems\"><thead><tr><th></th><th>Problem</th><th>Where</th><th>Why</th>"
            f"<th>Since</th><th>What to do</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
            + tables.pager("problems", data, query, "problems")) if rows else ""
    return (f'<section id="problems" class="summary {level}" data-level="{level}"><h2>{e(title)}</h2>{body}'
            f'<p class="note">{e(_checked(limits))}</p></section>')


def _section(name: str, title: str, data: dict[str, Any] | None, body: Callable[[dict[str, Any]], str]) -> str:
    if data is None:
        return ""
    content = _error(data["error"]) if "error" in data else body(data)
    return f'<h2 id="section-{name}">{title}</h2>{content}'


def _streams(data: dict[str, Any], view: dict[str, Any], query: Mapping[str, Any]) -> str:
    html = tables.table("streams", data["streams"], tables.STREAMS)
    html += tables.pager("streams", data, query, f"streams ({num(data['exist'])} on the server, "
                                                 f"{num(data['read'])} read)")
    others = view.get("other_streams") or []
    if others:
        focus = {k: v for k, v in query.items() if not k.endswith("_page")}
        links = " ".join(f'<a id="{e(row_anchor("streams", {"name": name}))}" href="{e(href(focus, stream=name))}#'
                         f'{e(row_anchor("streams", {"name": name}))}">{e(name)}</a>' for name in others)
        html += f'<p class="others" data-others="streams">On other pages (opens the stream alone): {links}</p>'
    return html


def _ledger(data: dict[str, Any], query: Mapping[str, Any]) -> str:
    states = list(data["runs"][0]["states"]) if data.get("runs") else []
    html = tables.table("ledger", data["runs"], tables.ledger_columns(states, query))
    what = (f"runs of run {data['run_id']!r}" if data.get("run_id") else "runs") + \
        f" ({num(data['read'])} of {num(data['entries'])} ledger entries read, newest first)"
    html += tables.pager("ledger", data, query, what)
    if data.get("older"):
        html += (f'<p class="note"><a href="{e(href(query, ledger_before=data["first_read_seq"], ledger_page=None))}'
                 '#section-ledger">older ledger entries</a></p>')
    if data.get("unreadable_count"):
        html += f'<p class="note">{num(data["unreadable_count"])} entries are not batch records (not counted)</p>'
    return html


def _advisories(data: dict[str, Any], query: Mapping[str, Any]) -> str:
    html = tables.table("advisories", data["advisories"], tables.ADVISORIES)
    html += tables.pager("advisories", data, query, f"advisories (the last {num(data['read'])} of "
                                                    f"{num(data['messages'])} captured messages read, newest first)")
    if data.get("api_audit_skipped"):
        html += f'<p class="note">{num(data["api_audit_skipped"])} API audit advisories not listed</p>'
    return html


def _form(view: dict[str, Any]) -> str:
    fields = [("ledger_bucket", "Ledger bucket", view["ledger_bucket"]),
              ("capture_stream", "Capture stream", view["capture_stream"]),
              ("stream", "Stream", view["focus"]["stream"] or ""), ("run_id", "Ledger run", view.get("run_id") or "")]
    inputs = "".join(f'<label>{e(label)} <input name="{name}" value="{e(value)}"></label>'
                     for name, label, value in fields)
    return f'<form method="get">{inputs}<button type="submit">Refresh</button></form>'


def page(view: dict[str, Any], *, query: Mapping[str, Any], index_href: str, age_s: float,
         limits: Thresholds) -> str:
    """The view of one connection: problems first, then streams, consumers, sources, ledger, advisories."""
    conn_id = view["connection_id"]
    server = view.get("server") or {}
    read = f"read {_ago(age_s)} ago" if age_s >= 1 else "read now"
    cluster = f" (cluster {e(server['cluster'])})" if server.get("cluster") else ""
    parts = [f'<p><a href="{e(index_href)}">All connections</a></p>',
             f"<h1>JetStream: connection <code>{e(conn_id)}</code></h1>",
             f'<p class="meta">servers {e(", ".join(view.get("servers", [])) or "-")} &middot; nats-server '
             f'{e(server.get("version") or "?")}{cluster}'
             f' &middot; {read} in {num(view.get("elapsed_ms"))} ms &middot; read-only: creates nothing on the '
             f'server &middot; <a href="{e(href(query, format="json"))}">JSON</a></p>', _form(view)]
    if view["focus"]["stream"]:
        parts.append(f'<p class="note">Showing only what concerns stream <b>{e(view["focus"]["stream"])}</b> &middot; '
                     f'<a href="{e(href(query, stream=None))}">show everything</a></p>')
    parts.append(problems_summary(view["problems"], query, limits))
    parts.append(_section("streams", "Streams", view.get("streams"), lambda d: _streams(d, view, query)))
    parts.append(_section("consumers", "Consumers", view.get("consumers"), lambda d: tables.table(
        "consumers", d["consumers"], tables.CONSUMERS) + tables.pager("consumers", d, query, "consumers")))
    parts.append(_section("sources", "Sources and mirrors", view.get("sources"), lambda d: tables.table(
        "sources", d["sources"], tables.SOURCES) + tables.pager("sources", d, query, "sources")))
    parts.append(_section("ledger", f"Batch ledger <code>{e(view['ledger_bucket'])}</code>", view.get("ledger"),
                          lambda d: _ledger(d, query)))
    parts.append(_section("advisories", f"Recent advisories <code>{e(view['capture_stream'])}</code>",
                          view.get("advisories"), lambda d: _advisories(d, query)))
    return document(f"JetStream: {conn_id}", "".join(parts))


def unavailable(conn_id: str, error: Mapping[str, Any], *, index_href: str, servers: Sequence[str]) -> str:
    """The page when NATS cannot be read (answered 503)."""
    body = (f'<p><a href="{e(index_href)}">All connections</a></p><h1>JetStream: connection <code>{e(conn_id)}</code>'
            f'</h1><section id="problems" class="summary error" data-level="unavailable"><h2>NATS cannot be read</h2>'
            f'{_error(error)}<p class="meta">servers {e(", ".join(servers) or "-")}</p></section>')
    return document(f"JetStream: {conn_id}", body)


def refused(title: str, error: Mapping[str, Any], *, index_href: str) -> str:
    """The page of a request the view refuses (unknown connection, another type, bad parameters)."""
    return document(title, f'<p><a href="{e(index_href)}">All connections</a></p><h1>{e(title)}</h1>{_error(error)}')


def index(connection_ids: Sequence[str], *, link: Callable[[str], str]) -> str:
    """The list of ``nats`` connections the user may read, and a box for any other id."""
    items = "".join(f'<li><a href="{e(link(cid))}">{e(cid)}</a></li>' for cid in connection_ids)
    body = ("<h1>JetStream</h1><p class=\"meta\">Problems first, then streams, consumers, sources, the batch ledger "
            "and captured advisories of a <code>nats</code> connection (read-only).</p>"
            f"<ul>{items or '<li class=note>no nats connection stored in the metadata database</li>'}</ul>"
            '<form method="get" action="connections"><label>Connection id <input name="connection_id" '
            'value="nats_default"></label><button type="submit">Open</button></form>')
    return document("JetStream", body)


def document(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f"<style>{_STYLE}</style></head><body>{body}</body></html>")
