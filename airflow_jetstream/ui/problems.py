"""What in an overview needs a person: one problem per thing, with its kind, the object it names, why and since when.

:func:`find_problems` reads the rows of the overview (``ui/overview.py``: plain dicts) and returns problems worst
first: errors (something was lost, failed or cannot work) before warnings (something is stuck or slow and will
hurt if it stays), the oldest first within each; :data:`KINDS` names each kind and what to do about it.

``since`` is the server's time where the server says when (an advisory's timestamp, a consumer's last
delivery or acknowledgement, a ledger entry's times); otherwise the first time this process saw the
problem (:class:`Observations`, ``since_means`` says which). Thresholds are :class:`Thresholds`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_jetstream.client.advisories.types import parse_timestamp
from airflow_jetstream.ui.links import anchor, row_anchor

ERROR, WARNING = "error", "warning"
RANK = {ERROR: 0, WARNING: 1}
#: The ack wait the server uses when a consumer sets none.
DEFAULT_ACK_WAIT_S = 30.0

#: Per kind: severity and what to do about it (docs/ui.md explains each at length).
KINDS: dict[str, tuple[str, str]] = {
    "batch_abandoned": (ERROR, "nothing of the batch was stored (all-or-nothing): re-run the producing task; for "
                        "reason timeout check that the producer could reach the server during the batch"),
    "max_deliveries": (ERROR, "the consumer gave up on the message: find why its consumer failed it (task logs), fix, "
                       "then replay it (consumer reset to its sequence) or handle it by hand"),
    "msg_terminated": (WARNING, "a consumer terminated the message on purpose: check the reason and that dropping "
                       "it was intended"),
    "consumer_redelivering": (WARNING, "messages are delivered again because they were not acknowledged in "
                              "ack_wait: check the consuming task (errors, slowness) or raise ack_wait"),
    "ack_overdue": (WARNING, "messages wait for an acknowledgement for longer than ack_wait: the worker holding "
                    "them may be stuck or gone; check the consuming task"),
    "consumer_idle": (WARNING, "messages wait and nobody pulls them: check that the consuming task or Spark job "
                      "runs (and is scheduled), or delete the consumer if it is no longer used"),
    "consumer_paused": (WARNING, "the consumer is paused: nothing is delivered until it resumes; resume it if the "
                        "pause is no longer wanted"),
    "source_error": (ERROR, "the server reports an error for the source: fix what it names (consumer settings, "
                     "permissions, the origin stream)"),
    "source_inactive": (ERROR, "the source is not running: its consumer on the origin is missing or the origin "
                        "cannot be reached; check the origin stream and consumer, re-run the durable source task"),
    "source_stalled": (WARNING, "the source's backlog does not shrink: check the origin's consumer (paused, "
                       "max_ack_pending reached) and that the aggregate stream accepts messages (limits)"),
    "stream_no_leader": (ERROR, "the stream has no leader: reads and writes fail; check that a quorum of its "
                         "replicas' servers runs"),
    "replica_offline": (ERROR, "a replica's server is offline: the stream runs on fewer copies; bring the server "
                        "back or move the replica"),
    "replica_lagging": (WARNING, "a replica is behind the leader: it catches up by itself; if it stays behind, "
                        "check that server's disk and network"),
    "ledger_failed": (ERROR, "batches failed after their last attempt (dead letter): read last_error, fix the "
                      "cause, then requeue them (BatchLedger.requeue) and re-run the consuming task"),
    "ledger_overdue": (WARNING, "a batch is claimed past its visibility deadline: the worker holding it died or "
                       "hangs; the next claim or a reap returns it to published"),
    "capture_missing": (WARNING, "without the capture stream abandoned batches and given-up messages cannot be "
                        "seen: run JetStreamAdvisoryStreamOperator (or set capture_stream)"),
    "capture_writes_on_read": (WARNING, "reading this capture stream adds messages to it (it captures API audits or "
                               "lacks allow_direct): run JetStreamAdvisoryStreamOperator once to update it"),
    "watcher_waiting": (WARNING, "an event watcher waits for a stream that does not exist: no event comes until it "
                        "does; create the stream (JetStreamEnsureStreamOperator, or the DAG that makes it) or fix "
                        "the watcher's stream name"),
    "section_unreadable": (WARNING, "part of the view could not be read: see the section's error; what it would "
                           "show is unknown"),
    "read_incomplete": (WARNING, "more exists than the view reads: problems in what was not read are not shown; "
                        "raise [jetstream] view_max_streams / view_max_consumers"),
}


@dataclass(frozen=True)
class Thresholds:
    """When a state becomes a problem (seconds). Airflow's ``[jetstream]`` section sets them for the view."""

    #: Advisories in the window younger than this are problems (older ones are listed, not flagged).
    advisory_age: float = 24 * 3600.0
    #: A pull consumer with pending messages and no pull request waiting, nothing delivered for this long.
    pending_idle: float = 300.0
    #: Redelivered messages (``num_redelivered``) at or above this.
    redelivered: int = 1
    #: A source backlog that has not shrunk, or a source without activity, for this long.
    source_stalled: float = 60.0


@dataclass
class Observations:
    """What one process remembers between reads of a connection: when each problem was first seen, and each
    source's backlog the last time it shrank. Keys of problems that went away are forgotten."""

    first_seen: dict[str, datetime] = field(default_factory=dict)
    backlog: dict[str, tuple[int, datetime]] = field(default_factory=dict)

    def source_backlog_since(self, key: str, backlog: int, now: datetime) -> datetime:
        """When ``key``'s backlog last shrank (or was first seen); a backlog of 0 resets it."""
        before = self.backlog.get(key)
        if before is None or backlog < before[0] or backlog == 0:
            self.backlog[key] = (backlog, now)
            return now
        self.backlog[key] = (backlog, before[1])
        return before[1]


def _iso(when: datetime | None) -> str | None:
    return when.astimezone(UTC).isoformat() if when else None


def _problem(kind: str, obj: dict[str, Any], why: str, anchor: str, since: datetime | None = None,
             since_means: str | None = None) -> dict[str, Any]:
    severity, fix = KINDS[kind]
    return {"kind": kind, "severity": severity, "object": obj, "why": why, "since": _iso(since),
            "since_means": since_means if since else None, "fix": fix, "anchor": anchor, "count": 1, "newest": None}


def span(delta: timedelta | float) -> str:
    """A duration (or seconds) as people read it: ``45 s``, ``5 min``, ``1.5 h``, ``2 d`` (the page's and problems')."""
    seconds = int(delta.total_seconds() if isinstance(delta, timedelta) else delta)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}".replace(".0 ", " ")
    return f"{seconds} s"


def _advisory_why(kind: str, rows: list[dict[str, Any]]) -> str:
    """What the advisories of one kind about one object say; ``rows`` newest first."""
    newest, count = rows[0], len(rows)
    stream, consumer = newest.get("stream"), newest.get("consumer")
    seqs = ", ".join(str(row.get("stream_seq")) for row in rows[:5]) + (" ..." if count > 5 else "")
    if kind == "batch_abandoned":
        batches = ", ".join(repr(row.get("batch")) for row in rows[:5]) + (" ..." if count > 5 else "")
        return (f"the server abandoned atomic batch {newest.get('batch')!r} on stream {stream!r} "
                f"(reason {newest.get('reason') or 'unknown'})" if count == 1 else
                f"the server abandoned {count} atomic batches on stream {stream!r} ({batches}; newest: reason "
                f"{newest.get('reason') or 'unknown'})")
    if kind == "max_deliveries":
        return (f"consumer {consumer!r} of stream {stream!r} gave up on message {newest.get('stream_seq')} after "
                f"{newest.get('deliveries')} deliveries" if count == 1 else
                f"consumer {consumer!r} of stream {stream!r} gave up on {count} messages (stream seq {seqs}), the "
                f"newest after {newest.get('deliveries')} deliveries")
    reason = f" ({newest['reason']})" if newest.get("reason") else ""
    return (f"consumer {consumer!r} of stream {stream!r} terminated message {newest.get('stream_seq')}{reason}"
            if count == 1 else
            f"consumer {consumer!r} of stream {stream!r} terminated {count} messages (stream seq {seqs}){reason}")


def advisory_problems(rows: list[dict[str, Any]], limits: Thresholds, now: datetime) -> list[dict[str, Any]]:
    """Abandoned batches, given-up and terminated messages among the advisories younger than ``advisory_age``:
    one problem per kind and object (a stream's abandoned batches, a consumer's given-up or terminated messages)
    with their ``count``, since the oldest and ``newest`` the newest; it names the newest advisory's row."""
    groups: dict[tuple[Any, ...], list[tuple[dict[str, Any], datetime]]] = {}
    for row in rows:  # newest first
        when = parse_timestamp(row.get("timestamp"))
        if row.get("kind") not in ("batch_abandoned", "max_deliveries", "msg_terminated") or when is None \
                or now - when > timedelta(seconds=limits.advisory_age):
            continue
        consumer = None if row["kind"] == "batch_abandoned" else str(row.get("consumer"))
        groups.setdefault((row["kind"], str(row.get("stream")), consumer), []).append((row, when))
    out = []
    for (kind, _, _), found in groups.items():
        newest = found[0][0]
        obj = {"type": "advisory", "capture_seq": newest["capture_seq"], "stream": newest.get("stream")}
        if kind == "batch_abandoned":
            obj["batch"] = newest.get("batch")
        else:
            obj.update(consumer=newest.get("consumer"), stream_seq=newest.get("stream_seq"))
        problem = _problem(kind, obj, _advisory_why(kind, [row for row, _ in found]),
                           row_anchor("advisories", newest), min(when for _, when in found), "advisory time")
        out.append({**problem, "count": len(found), "newest": _iso(max(when for _, when in found))})
    return out


def _paused_since(advisories: list[dict[str, Any]], stream: str, consumer: str) -> datetime | None:
    for row in advisories:  # newest first
        if row.get("kind") == "consumer_pause" and row.get("stream") == stream and row.get("consumer") == consumer:
            return parse_timestamp(row.get("timestamp")) if row.get("paused") is not False else None
    return None


def consumer_problems(row: dict[str, Any], limits: Thresholds, now: datetime,
                      advisories: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Redeliveries, acknowledgements overdue, pending with nobody pulling, paused."""
    stream, name = row["stream"], row["name"]
    obj = {"type": "consumer", "stream": stream, "consumer": name}
    row_id = row_anchor("consumers", row)
    where = f"consumer {name!r} of stream {stream!r}"
    out = []
    if row["num_redelivered"] >= limits.redelivered:
        out.append(_problem("consumer_redelivering", obj, f"{where}: {row['num_redelivered']:,} message(s) "
                            f"redelivered, {row['num_ack_pending']:,} waiting for an acknowledgement", row_id))
    ack_wait = timedelta(seconds=row["ack_wait_ns"] / 1e9 if row["ack_wait_ns"] else DEFAULT_ACK_WAIT_S)
    last_ack = parse_timestamp(row.get("last_ack")) or parse_timestamp(row.get("created"))
    if row["num_ack_pending"] and row["ack_policy"] != "none" and last_ack and now - last_ack > ack_wait:
        out.append(_problem("ack_overdue", obj, f"{where}: {row['num_ack_pending']:,} message(s) delivered and not "
                            f"acknowledged, no acknowledgement for {span(now - last_ack)} (ack_wait "
                            f"{span(ack_wait)})", row_id, last_ack,
                            "last acknowledgement" if row.get("last_ack") else "consumer created"))
    last_pull = parse_timestamp(row.get("last_active")) or parse_timestamp(row.get("created"))
    if row["pull"] and row["num_pending"] and not row["num_waiting"] and not row["paused"] and last_pull \
            and now - last_pull > timedelta(seconds=limits.pending_idle):
        out.append(_problem("consumer_idle", obj, f"{where}: {row['num_pending']:,} message(s) pending, no pull "
                            f"request waiting, nothing delivered for {span(now - last_pull)}", row_id, last_pull,
                            "last delivery" if row.get("last_active") else "consumer created"))
    if row["paused"]:
        since = _paused_since(advisories, stream, name)
        out.append(_problem("consumer_paused", obj, f"{where} is paused until {row.get('pause_until')}", row_id,
                            since, "pause advisory time"))
    return out


def source_problems(row: dict[str, Any], limits: Thresholds, now: datetime,
                    seen: Observations) -> list[dict[str, Any]]:
    """A source with an error, not running, or whose backlog does not shrink."""
    stream, origin = row["stream"], row["source"]
    obj = {"type": "source", "stream": stream, "source": origin, "mirror": row.get("mirror", False)}
    row_id = row_anchor("sources", row)
    where = f"{'mirror' if row.get('mirror') else 'source'} {origin!r} of stream {stream!r}"
    if row.get("error"):
        return [_problem("source_error", obj, f"{where}: {row['error'].get('message')}", row_id)]
    if row["active"] < 0:
        return [_problem("source_inactive", obj, f"{where} is not active (no consumer on the origin delivers "
                         "to it)", row_id)]
    backlog = row["lag"] + (row.get("consumer_num_pending") or 0)
    shrunk = seen.source_backlog_since(f"{stream}>{origin}", backlog, now)
    idle = timedelta(seconds=row["active_s"] or 0)
    stalled = timedelta(seconds=limits.source_stalled)
    if backlog and (now - shrunk >= stalled or idle >= stalled):
        since, means = (now - idle, "last activity") if idle >= stalled else (shrunk, "backlog last shrank")
        return [_problem("source_stalled", obj, f"{where}: backlog of {backlog:,} message(s) not shrinking, last "
                         f"activity {span(idle)} ago", row_id, since, means)]
    return []


def stream_problems(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream of a cluster (or a replicated one) without a leader, with replicas offline or behind."""
    name = row["name"]
    obj = {"type": "stream", "stream": name}
    row_id = row_anchor("streams", row)
    if (row["num_replicas"] > 1 or row.get("cluster")) and not row.get("leader"):
        return [_problem("stream_no_leader", obj, f"stream {name!r} (R{row['num_replicas']}) has no leader", row_id)]
    offline = [peer["name"] for peer in row.get("replicas") or [] if peer["offline"]]
    behind = [f"{peer['name']} ({peer['lag']:,} behind)" for peer in row.get("replicas") or []
              if not peer["offline"] and not peer["current"]]
    found = (("replica_offline", "offline", offline), ("replica_lagging", "not current", behind))
    return [_problem(kind, obj, f"stream {name!r}: replica(s) {what}: {', '.join(peers)}", row_id)
            for kind, what, peers in found if peers]


#: The lists of a ledger run that are problems: (list, kind, the time of an item, what ``since`` means, what).
_LEDGER_LISTS = (("failed", "ledger_failed", "failed_at", "first failure", "failed after their last attempt"),
                 ("overdue", "ledger_overdue", "deadline", "visibility deadline",
                  "in progress past their visibility deadline"))


def ledger_problems(run: dict[str, Any], bucket: str) -> list[dict[str, Any]]:
    """Failed batches and claims past their visibility deadline of one ledger run."""
    out = []
    for part, kind, at, means, what in _LEDGER_LISTS:
        listed, count = run[part], run[f"{part}_count"]
        if not count:
            continue
        ids = ", ".join(f["batch_id"] for f in listed[:5]) + (" ..." if count > 5 else "")
        why = f"run {run['run_id']!r}: {count} batch(es) {what} ({ids})"
        if part == "failed":
            why += f"; last error: {listed[0].get('last_error')}"
        since = min((t for f in listed if (t := parse_timestamp(f.get(at)))), default=None)
        obj = {"type": "ledger_run", "bucket": bucket, "run_id": run["run_id"],
               "batches": [f["batch_id"] for f in listed]}
        out.append(_problem(kind, obj, why, row_anchor("ledger", run), since, means))
    return out


def capture_problems(section: dict[str, Any] | None, capture_stream: str) -> list[dict[str, Any]]:
    """A capture stream that is missing, or that reading it writes into."""
    obj = {"type": "capture_stream", "stream": capture_stream}
    if section is None:
        return []
    if "error" in section:
        if section["error"].get("reason") == "stream_not_found":
            return [_problem("capture_missing", obj, f"capture stream {capture_stream!r} does not exist",
                             "section-advisories")]
        return []
    facts = section["capture"]
    causes = (["it captures API audit advisories"] if facts["captures_api_audits"] else []) + \
             ([] if facts["allow_direct"] else ["it does not allow direct gets"])
    if causes and (facts["captures_api_audits"] or not facts["direct_reads"]):
        return [_problem("capture_writes_on_read", obj, f"capture stream {capture_stream!r}: {' and '.join(causes)}"
                         ", so every read of it adds messages and pushes advisories out", "section-advisories")]
    return []


def watcher_problems(watchers: dict[str, Any] | None, streams: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Event watchers of the connection waiting for a stream that does not exist (judged on a complete listing)."""
    if not watchers or "error" in watchers or not streams or "error" in streams \
            or streams.get("total", 0) > streams.get("read", 0) or streams.get("missing"):
        return []
    names = {row["name"] for row in streams.get("streams") or []}
    out = []
    for watcher in watchers.get("watchers") or []:
        if watcher["stream"] in names:
            continue
        obj = {"type": "watcher", "stream": watcher["stream"], "consumer": watcher["consumer"],
               "trigger_id": watcher["trigger_id"], "name": ", ".join(watcher["names"]) or None}
        out.append(_problem("watcher_waiting", obj, f"event watcher {', '.join(watcher['names']) or '(unnamed)'} "
                            f"(trigger {watcher['trigger_id']}) waits for stream {watcher['stream']!r}, which does "
                            "not exist", "section-streams", parse_timestamp(watcher.get("created")),
                            "watcher created"))
    return out


def read_problems(sections: dict[str, Any]) -> list[dict[str, Any]]:
    """Sections that could not be read, and listings cut at the view's bounds."""
    out = []
    for name, section in sections.items():
        if not isinstance(section, dict):
            continue
        error = section.get("error")
        if error and error.get("reason") not in ("ledger_not_found", "stream_not_found"):
            out.append(_problem("section_unreadable", {"type": "section", "section": name},
                                f"{name}: {error.get('message')}", f"section-{name}"))
        for stream, failed in (section.get("errors") or {}).items():
            out.append(_problem("section_unreadable", {"type": "section", "section": name, "stream": stream},
                                f"{name} of stream {stream!r}: {failed.get('message')}", anchor("stream", stream)))
        if section.get("total", 0) > section.get("read", section.get("total", 0)):
            out.append(_problem("read_incomplete", {"type": "section", "section": name},
                                f"{name}: read {section['read']:,} of {section['total']:,}", f"section-{name}"))
        for missing in section.get("missing") or []:
            out.append(_problem("stream_no_leader" if name == "streams" else "section_unreadable",
                                {"type": "section", "section": name, "name": missing},
                                f"{name}: {missing!r} listed without info (no answer from its leader)",
                                f"section-{name}"))
    return out


def find_problems(snapshot: dict[str, Any], limits: Thresholds, seen: Observations,
                  now: datetime | None = None) -> list[dict[str, Any]]:
    """Every problem of an overview ``snapshot`` (sections ``streams``, ``consumers``, ``sources``, ``ledger``,
    ``advisories``, each possibly ``{"error": ...}``), worst first. ``seen`` gives ``since`` where the server
    says nothing and is updated."""
    now = now or datetime.now(UTC)
    advisories = (snapshot.get("advisories") or {}).get("advisories") or []
    found: list[dict[str, Any]] = []
    found += advisory_problems(advisories, limits, now)
    for row in (snapshot.get("streams") or {}).get("streams") or []:
        found += stream_problems(row)
    for row in (snapshot.get("consumers") or {}).get("consumers") or []:
        found += consumer_problems(row, limits, now, advisories)
    for row in (snapshot.get("sources") or {}).get("sources") or []:
        found += source_problems(row, limits, now, seen)
    ledger = snapshot.get("ledger") or {}
    for run in ledger.get("runs") or []:
        found += ledger_problems(run, ledger.get("bucket", ""))
    found += capture_problems(snapshot.get("advisories"), snapshot.get("capture_stream", ""))
    found += watcher_problems(snapshot.get("watchers"), snapshot.get("streams"))
    found += read_problems({name: snapshot.get(name) for name in ("streams", "consumers", "sources", "ledger",
                                                                   "advisories", "watchers")})
    keys = set()
    for problem in found:
        key = f"{problem['kind']}|{problem['anchor']}|{problem['object']}"
        keys.add(key)
        if problem["since"] is None:
            problem["since"] = _iso(seen.first_seen.setdefault(key, now))
            problem["since_means"] = "first seen by this view"
    for key in set(seen.first_seen) - keys:
        del seen.first_seen[key]
    found.sort(key=lambda p: (RANK[p["severity"]], p["since"] or "~", p["kind"], p["anchor"]))
    return found
