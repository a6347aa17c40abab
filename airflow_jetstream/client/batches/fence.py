"""Write fences: an atomic batch with a fence id commits at most once, at any time later, checked by the server.

A fenced batch ends with its *fence*, a message on ``_FENCE.<stream>.<fence id>`` with
``Nats-Expected-Last-Subject-Sequence: 0``, which nats-server (2.12+) checks at commit under the stream's lock:
every later commit of the same fence id (a retry, a re-run, a writer frozen and resumed) is refused whole and
stores nothing. No duplicate window, no clock and no look before the write decide it. The stored fence (one
message get) then names the sequences the earlier commit occupies, so the caller records what the server committed
even when the attempt that committed it died first (docs/batch-publishing.md, fences).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.batches.types import HEADER_BATCH_ID, HEADER_BATCH_SEQUENCE, BatchMessage
from airflow_jetstream.client.errors import BatchPublishError
from airflow_jetstream.client.subjects import FENCE_PREFIX, fence_namespace, fence_subject, subject_matches

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

#: Messages of a fenced batch the caller gives, for the server's ``max_msgs`` (default 1000): one is the fence.
FENCED_MAX_MSGS = 999
#: ``retention`` values under which a stored fence stays until the stream's limits remove it.
_KEEPING_RETENTION = ("limits", "workqueue")


def check_fence_config(stream: str, config: dict[str, Any]) -> None:
    """Refuse, before anything is published, a stream whose config cannot keep fences (reason ``stream_not_fenced``)."""
    retention = config.get("retention", "limits")
    if retention not in _KEEPING_RETENTION:
        raise BatchPublishError(
            f"stream {stream!r} has retention {retention!r}, which removes a fence as soon as it is stored (no "
            "consumer is interested in it), so it could not refuse a second commit; write to a limits or workqueue "
            "stream, or opt out with fence=False (duplicates then bounded only by the duplicate_window)",
            reason="stream_not_fenced")
    subject = fence_subject(stream, "check")
    if not any(subject_matches(pattern, subject) for pattern in config.get("subjects") or []):
        raise BatchPublishError(
            f"stream {stream!r} has no fence subjects, which exactly-once atomic writes need (a retry or re-run "
            f"after the duplicate window would store the batches again); add {fence_namespace(stream)!r} to its "
            "subjects (JetStreamEnsureStreamOperator / ensure_stream add it to every allow_atomic stream), or opt "
            "out with fence=False, which leaves duplicates bounded only by the stream's duplicate_window",
            reason="stream_not_fenced")


def content_digest(messages: Sequence[BatchMessage]) -> str:
    """A digest of the messages' subjects and payloads: what a fence says its batch held. Every fenced chunk pays
    for it on every attempt, so it hashes three joined parts (the lengths, then the subjects, then the payloads:
    unambiguous together) instead of one update per message, which cost three times as much (docs/performance.md)."""
    subjects = [msg.subject for msg in messages]
    payloads = [msg.data for msg in messages]
    digest = hashlib.sha256(struct.pack(f"<{2 * len(subjects)}Q", *map(len, subjects), *map(len, payloads)))
    digest.update("".join(subjects).encode())
    digest.update(b"".join(payloads))
    return digest.hexdigest()[:32]


def fence_message(stream: str, fence_id: str, messages: Sequence[BatchMessage]) -> BatchMessage:
    """The fence a batch of ``messages`` ends with (the same bytes for every attempt of the batch)."""
    payload = json.dumps({"fence": fence_id, "count": len(messages), "digest": content_digest(messages)},
                         separators=(",", ":")).encode()
    return BatchMessage(fence_subject(stream, fence_id), payload, expected_last_subject_seq=0)


@dataclass(frozen=True)
class StoredFence:
    """Where an earlier commit of a fenced batch lies: its messages are ``first_seq .. last_seq``, the fence after."""

    batch: str
    count: int
    first_seq: int
    last_seq: int
    digest: str


async def stored_fence(conn: JetStreamConnection, stream: str, fence_id: str) -> StoredFence | None:
    """The earlier commit of ``fence_id`` in ``stream``, read from its fence (one message get), or None.

    A fence follows the messages it covers (its whole batch, or in a Batcher's group its one item): its count n
    names the n sequences before its own, which its ``Nats-Batch-Sequence`` k must allow (1 <= n < k).
    """
    # here, not at the top: DAG files import the fence's names; nats-py loads when a fence is read
    from airflow_jetstream.client.reading.stored import get_message

    subject = fence_subject(stream, fence_id)
    raw = await get_message(conn, stream, subject=subject)
    if raw is None:
        return None
    headers = raw.headers
    try:
        position = int(headers.get(HEADER_BATCH_SEQUENCE, "0"))
        body = json.loads(raw.data or b"{}")
        count, digest = int(body.get("count", -1)), str(body.get("digest", ""))
    except (TypeError, ValueError, AttributeError):
        position, count, digest = 0, -1, ""
    if not 1 <= count < position:
        raise BatchPublishError(
            f"stream {stream!r} seq {raw.seq} on fence subject {subject!r} is not a fence this provider wrote "
            f"(batch position {position}, count {count}); nothing was published. Leave the {FENCE_PREFIX} "
            "subjects to the provider", reason="fence_invalid")
    return StoredFence(batch=str(headers.get(HEADER_BATCH_ID, "")), count=count,
                       first_seq=raw.seq - count, last_seq=raw.seq - 1, digest=digest)


async def fence_count(conn: JetStreamConnection, stream: str) -> int:
    """How many write fences ``stream`` holds (one per fenced batch, up to the server's 100,000 subjects per
    answer): its message count less this is its data."""
    info = await conn.api_request(f"STREAM.INFO.{stream}", {"subjects_filter": f"{FENCE_PREFIX}.{stream}.>"},
                                  context=f"stream {stream!r}")
    return len((info.get("state") or {}).get("subjects") or {})
