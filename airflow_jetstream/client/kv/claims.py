"""Once-only claims: one KV key per processed item, created by whoever processes the item first.

A claim is one publish of the key with ``Nats-Expected-Last-Subject-Sequence: 0`` (the key must not exist):
one round trip, no bucket lookup. A key that exists is someone else's claim, unless its last value is a delete
marker (a claim released after its work failed): then the claim is made over that marker, compare-and-set on
its sequence. Releasing a claim writes a delete marker only while the key is still at the claim's own sequence.

The bucket keeps each claim ``ttl`` after it was made (:data:`DEFAULT_CLAIM_TTL`) and, with ``max_bytes``, at
most that many bytes: past either, the oldest claims go, and an item whose claim went is processed again if it
comes back. A full bucket (``max_bytes``) refuses new claims (the KV bucket discards new writes) rather than
forgetting old ones: the task fails, naming the bound.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import KeyValueError, RequestTimeoutError
from airflow_jetstream.client.kv.bucket import ensure_bucket
from airflow_jetstream.client.kv.keys import CasConflict, Write, is_marker, write
from airflow_jetstream.client.kv.names import validate_key
from airflow_jetstream.client.reading.stored import get_message

#: How long a claim is kept after it was made.
DEFAULT_CLAIM_TTL = "7d"
_ATTEMPTS = 3


async def open_claims(conn: JetStreamConnection, bucket: str, *, ttl: float | str | timedelta = DEFAULT_CLAIM_TTL,
                      max_bytes: int | None = None) -> dict[str, Any]:
    """Create the claims bucket, or bring its retention to ``ttl``/``max_bytes``; returns the bucket's settings
    (:func:`~airflow_jetstream.client.kv.bucket.ensure_bucket`'s ``ttl``, ``values``, ...)."""
    return await ensure_bucket(conn, bucket, ttl=ttl, max_bytes=max_bytes,
                               description="airflow-jetstream once-only claims")


async def claim(conn: JetStreamConnection, bucket: str, key: str, value: dict[str, Any]) -> int | None:
    """Claim ``key`` (``value`` is stored with a ``claim_id`` of this call): its revision when this call made the
    claim, None when the key is claimed already. A claim whose answer was lost is recognised by its ``claim_id``."""
    validate_key(key)
    data = json.dumps({**value, "claim_id": uuid.uuid4().hex}, separators=(",", ":")).encode()
    context = f"claim {key!r} in bucket {bucket!r}"
    expected = 0
    for _ in range(_ATTEMPTS):
        try:
            made: int | str = await _put(conn, bucket, key, data, expected=expected, context=context)
        except RequestTimeoutError:
            made = "unanswered"
        if isinstance(made, int):
            return made
        stored = await get_message(conn, f"KV_{bucket}", subject=f"$KV.{bucket}.{key}")
        if stored is not None and stored.data == data:
            return stored.seq  # this call's claim: its answer was lost
        if stored is not None and not is_marker(stored.headers):
            return None  # someone's claim
        expected = stored.seq if stored is not None else 0  # released (a delete marker), or nothing yet
    raise conn.unanswered(f"{context}: no answer in {_ATTEMPTS} tries")


async def release(conn: JetStreamConnection, bucket: str, key: str, revision: int) -> bool:
    """Delete the claim made at ``revision`` (a delete marker, written only while the key is still there)."""
    result = await _put(conn, bucket, key, b"", expected=revision, headers={"KV-Operation": "DEL"},
                        context=f"release claim {key!r} in bucket {bucket!r}")
    return isinstance(result, int)


async def _put(conn: JetStreamConnection, bucket: str, key: str, data: bytes, *, expected: int, context: str,
               headers: dict[str, str] | None = None) -> int | str:
    """Write ``data`` under ``key`` if its last sequence is ``expected``: the new sequence, or ``"moved"``."""
    try:
        return await write(conn, bucket, [Write(key, data, expected, headers or {})], context=context,
                           missing=_no_bucket)
    except CasConflict:
        return "moved"


def _no_bucket(context: str) -> KeyValueError:
    return KeyValueError(f"{context}: no stream stores its key: the bucket does not exist (open it with open_claims)",
                         reason="bucket_not_found")
