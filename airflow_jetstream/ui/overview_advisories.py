"""The last advisories of the capture stream, read without a consumer: the JetStream view's advisory window.

The window is the capture stream's last ``limit`` messages, read with
:func:`~airflow_jetstream.client.reading.stored.read_messages` (direct batches when the stream allows
direct gets, message gets otherwise), newest first. Reading it writes nothing into the capture stream
when the stream is the provider's (``allow_direct``, no API audits): ``capture`` says when it is not.
"""

from __future__ import annotations

from typing import Any

from airflow_jetstream.client.advisories.capture import capture_info
from airflow_jetstream.client.advisories.types import ADVISORY_PREFIX, decode_advisory
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.reading.stored import direct_allowed, method_of, read_messages
from airflow_jetstream.client.subjects import subject_matches, validate_name

#: Captured messages one overview reads unless told otherwise.
MAX_ADVISORIES = 1000
#: The API audit advisory's subject (one per JetStream API call of any client).
API_AUDIT_SUBJECT = f"{ADVISORY_PREFIX}.API"
#: Advisory fields shown besides kind, time and capture sequence (no client details, no request bodies).
FIELDS = ("stream", "consumer", "domain", "batch", "reason", "stream_seq", "deliveries", "action", "leader",
          "paused", "pause_until")


def advisory_row(data: bytes, subject: str, seq: int) -> dict[str, Any] | None:
    """A captured message as a row (None when it is not an advisory's JSON)."""
    advisory = decode_advisory(data, subject=subject, capture_seq=seq)
    if advisory is None:
        return None
    raw = advisory.raw
    row: dict[str, Any] = {"capture_seq": seq, "kind": advisory.kind, "type": advisory.type, "subject": subject,
                           "timestamp": advisory.timestamp.isoformat() if advisory.timestamp else None}
    row.update({name: raw[name] for name in FIELDS if isinstance(raw.get(name), (str, int, float, bool))})
    return row


def capture_facts(conn: JetStreamConnection, info: dict[str, Any]) -> dict[str, Any]:
    """What a reader needs to know of the capture stream: whether it answers direct gets and captures API audits
    (then every JetStream API call, this view's message gets included, adds a message to it)."""
    config, state = info.get("config") or {}, info.get("state") or {}
    subjects = list(config.get("subjects") or [])
    return {
        "subjects": subjects,
        "allow_direct": bool(config.get("allow_direct")),
        "direct_reads": direct_allowed(conn, info, batch=True),
        "captures_api_audits": any(subject_matches(s, API_AUDIT_SUBJECT) for s in subjects),
        "messages": int(state.get("messages") or 0),
        "first_seq": int(state.get("first_seq") or 0),
        "last_seq": int(state.get("last_seq") or 0),
        "first_ts": state.get("first_ts"),
        "max_age_s": int(config.get("max_age") or 0) / 1e9 or None,
    }


async def recent_advisories(conn: JetStreamConnection, capture_stream: str, *,
                            limit: int = MAX_ADVISORIES) -> dict[str, Any]:
    """The advisories among the last ``limit`` messages of the capture stream, newest first.

    API audit advisories (when the stream captures them) are counted in ``api_audit_skipped``, not listed.
    ``read`` counts the messages read, ``messages`` those stored. A missing capture stream is
    :class:`~airflow_jetstream.client.errors.StreamNotFoundError` naming the fix.
    """
    validate_name(capture_stream, what="capture stream")
    info = await capture_info(conn, capture_stream)
    facts = capture_facts(conn, info)
    first, last = max(facts["first_seq"], 1), facts["last_seq"]
    start = max(first, last - limit + 1)
    messages = await read_messages(conn, capture_stream, start, last, info=info)
    rows = [row for msg in reversed(messages) if (row := advisory_row(msg.data, msg.subject, msg.seq))]
    audits = sum(row["kind"] == "api_audit" for row in rows)
    return {"capture_stream": capture_stream, "advisories": [row for row in rows if row["kind"] != "api_audit"],
            "api_audit_skipped": audits, "read": len(messages), "messages": facts["messages"],
            "window_start_seq": start, "method": method_of(conn, info) if last >= start else "none", "capture": facts}
