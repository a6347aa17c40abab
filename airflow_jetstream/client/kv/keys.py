"""Write and read keys of a KV bucket: put, create (only if absent), update at a revision, delete, get; every write
is the toolkit's own publish (:func:`write`, compare-and-set, several keys at once: the batch ledger's and the
claims' too); and once-only claims built on them.

A once-only claim (:func:`claim`) is one KV key per processed item, created by whoever processes it first: one
publish with ``Nats-Expected-Last-Subject-Sequence: 0``, no bucket lookup. A key that exists is someone else's
claim, unless its last value is a delete marker (a claim released after its work failed): then the claim is made
over that marker, compare-and-set on its sequence; a release writes a delete marker only while the key is still at
the claim's own sequence. The bucket keeps each claim ``ttl`` after it was made and, with ``max_bytes``, at most
that many bytes: past either, the oldest claims go (an item whose claim went is processed again if it comes back);
a full bucket refuses new claims rather than forgetting old ones, so the task fails naming the bound.

Values: ``bytes`` as they are, ``str`` as UTF-8, anything else (dict, list, number, bool) as JSON.
Entries are returned as JSON-able dicts: ``{"bucket", "key", "revision", "value", "encoding",
"json", "operation", "created"}`` where ``value`` is the UTF-8 text (base64 for binary values) and
``json`` the parsed value when it is JSON.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    BatchPublishError,
    InvalidRequestError,
    JetStreamError,
    JetStreamNotEnabledError,
    KeyRevisionError,
    KeyValueError,
    LedgerConflictError,
    RequestTimeoutError,
    StreamNotFoundError,
    error_from_api,
)
from airflow_jetstream.client.kv.bucket import bucket_missing, ensure_bucket, kv_errors
from airflow_jetstream.client.kv.names import KeyCondition, stream_of, validate_key
from airflow_jetstream.client.reading.apply_function import with_result
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.client.reading.shared_tail import follow
from airflow_jetstream.client.reading.stored import direct_allowed, get_message
from airflow_jetstream.client.retry import Backoff, retry

#: Server answers that mean the batch was not stored and may be sent again: too many batches in flight on the
#: stream (429/10210; nats-server 2.12 answers a full table with 10176 "incomplete", as it does a lost message).
_NOT_STORED = {10210: "too many atomic batches in flight", 10176: "atomic batch incomplete"}
_BUSY = "atomic_batch_busy"
#: A key moved since it was read (10071, "wrong last sequence: N"), or on a cluster another write of the key is still
#: in flight at the leader (10164, "last sequence by subject mismatch"): a lost race either way, nothing stored.
_WRONG_LAST = frozenset({10071, 10164})
_ATOMIC_DISABLED = 10174
BUSY = Backoff(0.01, 0.5, jitter=True)
log = logging.getLogger(__name__)


def encode_value(value: Any) -> bytes:
    """The bytes stored for ``value`` (bytes as is, str as UTF-8, else JSON)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        raise InvalidRequestError("a KV value is required (None given); use delete to remove a key",
                                  reason="missing_value")
    try:
        return json.dumps(value).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"KV value of type {type(value).__name__} is not JSON-able ({exc}); pass bytes, "
                                  "a str or JSON-able data", reason="invalid_value") from None


def entry_dict(bucket: str, key: str, revision: int | None, data: bytes | None, *,
               created: Any = None) -> dict[str, Any]:
    """The JSON-able form of a KV entry (a value: markers are no entry)."""
    data = data or b""
    try:
        value, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        value, encoding = base64.b64encode(data).decode("ascii"), "base64"
    entry: dict[str, Any] = {"bucket": bucket, "key": key, "revision": revision, "value": value,
                             "encoding": encoding, "operation": "PUT",
                             "created": created.isoformat() if hasattr(created, "isoformat") else created}
    if encoding == "utf-8":
        with contextlib.suppress(ValueError):
            entry["json"] = json.loads(value)
    return entry


async def get_key(conn: JetStreamConnection, bucket: str, key: str) -> dict[str, Any] | None:
    """The key's current entry, or None when it does not exist (never written, deleted, purged or expired: a
    marker, :func:`is_marker`). Read as the bucket's stream allows (direct get, else message get), as a watch of
    the key reads it (:func:`wait_for_key`)."""
    validate_key(key)
    stream = stream_of(bucket)
    try:
        direct = direct_allowed(conn, await stream_info(conn, stream))
        stored = await get_message(conn, stream, subject=f"$KV.{bucket}.{key}", direct=direct)
    except StreamNotFoundError:
        raise bucket_missing(f"KV bucket {bucket!r}") from None
    if stored is None or is_marker(stored.headers):
        return None
    return entry_dict(bucket, key, stored.seq, stored.data)


async def put_key(conn: JetStreamConnection, bucket: str, key: str, value: Any) -> dict[str, Any]:
    """Write ``value`` whatever the key holds; returns ``{"bucket", "key", "operation", "revision"}``."""
    revision = await _write_key(conn, bucket, key, value)
    return {"bucket": bucket, "key": key, "operation": "put", "revision": revision}


async def create_key(conn: JetStreamConnection, bucket: str, key: str, value: Any) -> dict[str, Any]:
    """Write ``value`` only if the key does not exist: it has no value, or its last is a marker (deleted, purged, or
    the server's marker of an expired key, which nats-py's create would not write over); else ``key_exists``."""
    try:
        return {"bucket": bucket, "key": key, "operation": "create",
                "revision": await _write_key(conn, bucket, key, value, expected=0)}
    except CasConflict:  # it has a last message: written over when that is a marker
        last = await get_message(conn, stream_of(bucket), subject=f"$KV.{bucket}.{key}")
    if last is not None and is_marker(last.headers):
        with contextlib.suppress(CasConflict):  # written meanwhile: it exists
            return {"bucket": bucket, "key": key, "operation": "create",
                    "revision": await _write_key(conn, bucket, key, value, expected=last.seq)}
    current = await _current_revision(conn, bucket, key)
    raise KeyRevisionError(f"KV bucket {bucket!r}: key {key!r} already exists (revision {current}); use "
                           "put to overwrite it or update with that revision", reason="key_exists")


def _check_revision(revision: Any) -> int:
    if isinstance(revision, str) and revision.strip().isdigit():
        revision = int(revision)
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        raise InvalidRequestError(f"revision must be the key's current revision (an int >= 1), got {revision!r}",
                                  reason="invalid_revision")
    return revision


async def update_key(conn: JetStreamConnection, bucket: str, key: str, value: Any, revision: int) -> dict[str, Any]:
    """Write ``value`` only if the key is still at ``revision`` (compare-and-set)."""
    validate_key(key)
    revision = _check_revision(revision)
    try:
        new_revision = await _write_key(conn, bucket, key, value, expected=revision)
    except CasConflict:
        current = await _current_revision(conn, bucket, key)
        raise KeyRevisionError(f"KV bucket {bucket!r}: key {key!r} is at revision {current}, not {revision}: "
                               "someone else changed it; read it again and retry with its revision",
                               reason="wrong_revision") from None
    return {"bucket": bucket, "key": key, "operation": "update", "revision": new_revision,
            "previous_revision": revision}


async def delete_key(conn: JetStreamConnection, bucket: str, key: str, *, revision: int | None = None,
                     purge: bool = False) -> dict[str, Any]:
    """Delete the key (a delete marker; ``purge`` also drops its history), optionally only at ``revision``."""
    validate_key(key)
    if revision is not None:
        revision = _check_revision(revision)
        if purge:
            raise InvalidRequestError("purge cannot be combined with revision; delete at the revision, or purge "
                                      "without one", reason="invalid_option")
    marker = {"KV-Operation": "PURGE", "Nats-Rollup": "sub"} if purge else {"KV-Operation": "DEL"}
    try:
        await _write_key(conn, bucket, key, b"", expected=revision, headers=marker)
    except CasConflict:
        current = await _current_revision(conn, bucket, key)
        raise KeyRevisionError(f"KV bucket {bucket!r}: key {key!r} is at revision {current}, not {revision}; "
                               "nothing was deleted", reason="wrong_revision") from None
    return {"bucket": bucket, "key": key, "operation": "purge" if purge else "delete", "revision": revision}


async def _write_key(conn: JetStreamConnection, bucket: str, key: str, value: Any, *, expected: int | None = None,
                     headers: Mapping[str, str] | None = None) -> int:
    """Publish one write of ``key`` as the KV API does (:func:`write`), on a bucket that exists (its stream info,
    as nats-py reads it to open a bucket): the new revision, or :class:`CasConflict`."""
    validate_key(key)
    data = encode_value(value)
    async with kv_errors(conn, bucket, f"KV bucket {bucket!r}"):
        try:
            await stream_info(conn, stream_of(bucket))
        except StreamNotFoundError:
            raise bucket_missing(f"KV bucket {bucket!r}") from None
    return await write(conn, bucket, [Write(key, data, expected, headers or {})],
                      context=f"KV bucket {bucket!r} key {key!r}")


async def _current_revision(conn: JetStreamConnection, bucket: str, key: str) -> int | None:
    entry = await get_key(conn, bucket, key)
    return None if entry is None else int(entry["revision"])


class CasConflict(Exception):
    """A key moved since it was read (the server's wrong last sequence): nothing of the write was stored."""


@dataclass(frozen=True)
class Write:
    """Put ``data`` under ``key`` if the key's last revision is still ``expected`` (0: the key must not exist; None:
    whatever it is), with ``headers`` (``KV-Operation: DEL`` makes it a delete marker)."""

    key: str
    data: bytes
    expected: int | None
    headers: Mapping[str, str] = field(default_factory=dict)


def is_marker(headers: Mapping[str, str] | None) -> bool:
    """Whether a KV message is a delete or purge marker (or the server's marker of an expired key)."""
    if not headers:
        return False
    return headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers


async def write(conn: JetStreamConnection, bucket: str, writes: Sequence[Write], *, context: str,
                missing: Callable[[str], JetStreamError] = bucket_missing) -> int:
    """Store every write or none (several writes are one atomic batch: the bucket's stream needs ``allow_atomic``),
    each only if its key is still at its expected revision; returns the stream sequence of the last one (the others
    precede it in order). Raises :class:`CasConflict` when a key moved, ``missing(context)`` when no stream stores
    the bucket (on a cluster, no answer may also be an election: then it is unanswered). A batch the server turned
    away because it is busy is sent again (nothing of it was stored). A write that got no answer may or may not be
    stored: callers read again and compare, never send it twice blindly."""

    def busy(exc: JetStreamError) -> str | None:
        return exc.message if exc.reason == _BUSY else None

    try:
        async with kv_errors(conn, bucket, context):  # a refused publish names the first subject
            return await retry(context, lambda: _send(conn, bucket, writes, context), transient=busy,
                               budget=conn.settings.leader_wait, backoff=BUSY)
    except JetStreamNotEnabledError:  # no responder on a single server: no stream stores the bucket
        raise missing(context) from None


async def _send(conn: JetStreamConnection, bucket: str, writes: Sequence[Write], context: str) -> int:
    batch_id = uuid.uuid4().hex
    last = len(writes)
    reply = None
    for number, item in enumerate(writes, start=1):
        headers = dict(item.headers)
        if item.expected is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(item.expected)
        if last > 1:
            headers.update({"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(number)})
            if number == last:
                headers["Nats-Batch-Commit"] = "1"
        subject = f"$KV.{bucket}.{item.key}"
        if number < last:
            await conn.nc.publish(subject, item.data, headers=headers)  # answered by the commit's ack
        else:
            try:
                reply = await conn.request(subject, item.data, headers=headers)
            except JetStreamNotEnabledError:  # no responder: no stream stores the key (or, on a cluster, no leader)
                if conn.clustered:
                    raise conn.unanswered(f"{context}: no stream leader answered {subject!r}") from None
                raise
    ack = _parse(reply.data if reply is not None else b"", context)
    if "error" in ack:
        error = ack["error"]
        err_code = error.get("err_code")
        if err_code in _WRONG_LAST:
            raise CasConflict(error.get("description"))
        if err_code in _NOT_STORED:
            raise BatchPublishError(f"{context}: {_NOT_STORED[err_code]} (err_code {err_code}), nothing stored",
                                    reason=_BUSY, code=error.get("code"), err_code=err_code)
        if err_code == _ATOMIC_DISABLED:
            raise LedgerConflictError(
                f"{context}: the ledger bucket {bucket!r} does not allow atomic batches; open it once with "
                "BatchLedger.open(conn, bucket) (a writer), which enables allow_atomic and allow_direct",
                reason="ledger_not_atomic", code=error.get("code"), err_code=err_code)
        raise error_from_api(error, context=context)
    return int(ack["seq"])


def _parse(data: bytes, context: str) -> dict[str, Any]:
    try:
        ack = json.loads(data or b"{}")
    except ValueError:
        raise JetStreamError(f"{context}: the server answered non-JSON data") from None
    if not isinstance(ack, dict) or ("error" not in ack and "seq" not in ack):
        raise JetStreamError(f"{context}: the server answered {ack!r}, not a publish acknowledgement")
    return ack


#: How long a claim is kept after it was made.
DEFAULT_CLAIM_TTL = "7d"
_CLAIM_ATTEMPTS = 3


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
    for _ in range(_CLAIM_ATTEMPTS):
        with contextlib.suppress(CasConflict, RequestTimeoutError):  # moved, or unanswered: read what is stored
            return await write(conn, bucket, [Write(key, data, expected)], context=context, missing=_no_bucket)
        stored = await get_message(conn, stream_of(bucket), subject=f"$KV.{bucket}.{key}")
        if stored is not None and stored.data == data:
            return stored.seq  # this call's claim: its answer was lost
        if stored is not None and not is_marker(stored.headers):
            return None  # someone's claim
        expected = stored.seq if stored is not None else 0  # released (a delete marker), or nothing yet
    raise conn.unanswered(f"{context}: no answer in {_CLAIM_ATTEMPTS} tries")


async def release(conn: JetStreamConnection, bucket: str, key: str, revision: int) -> bool:
    """Delete the claim made at ``revision`` (a delete marker, written only while the key is still there)."""
    try:
        await write(conn, bucket, [Write(key, b"", revision, {"KV-Operation": "DEL"})],
                    context=f"release claim {key!r} in bucket {bucket!r}", missing=_no_bucket)
    except CasConflict:
        return False
    return True


def _no_bucket(context: str) -> KeyValueError:
    return KeyValueError(f"{context}: no stream stores its key: the bucket does not exist (open it with open_claims)",
                         reason="bucket_not_found")


# Wait until a key exists, equals a value, or satisfies a function: one look now (check_key: a direct or message get
# of its current value), or until it holds (wait_for_key: its value once, then its changes through the subscription
# the process shares for the bucket, reading/shared_tail.py: a thousand waiting triggers on one bucket are one
# consumer, not a thousand). Neither creates a consumer of its own.


async def _holds(condition: KeyCondition, entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The entry (with the function's result) when it exists and satisfies ``condition``, else None."""
    if entry is None:
        return None
    result = await condition.holds(entry)
    return with_result(entry, result) if result else None


def _entry(bucket: str, key: str, message: Message) -> dict[str, Any] | None:
    """A stored KV message as an entry, or None when it removed the key (a marker, as :func:`get_key` reads it)."""
    if is_marker(message.headers):
        return None
    return entry_dict(bucket, key, message.seq, message.data, created=message.time)


async def check_key(conn: JetStreamConnection, bucket: str, key: str, condition: KeyCondition) -> dict[str, Any] | None:
    """The key's entry when it satisfies ``condition`` now, else None."""
    return await _holds(condition, await get_key(conn, bucket, key))


async def wait_for_key(conn: JetStreamConnection, bucket: str, key: str, condition: KeyCondition) -> dict[str, Any]:
    """The key's current value first, then each change, until one satisfies ``condition``; return its entry.

    A deleted or purged key does not exist. Cancel the task to stop waiting.
    """
    validate_key(key)
    stream, subject = stream_of(bucket), f"$KV.{bucket}.{key}"
    try:
        async with follow(conn, stream, subject) as listener:
            async with listener.catching_up():
                direct = direct_allowed(conn, await listener.tail.info())
                current = await get_message(conn, stream, subject=subject, direct=direct)
            seen = listener.since
            if current is not None:
                seen = max(seen, current.seq)
                found = await _holds(condition, _entry(bucket, key, current))
                if found is not None:
                    return found
            while True:
                for message in await listener.next_batch():
                    if message.seq <= seen:
                        continue  # the value read first already covered it
                    seen = message.seq
                    found = await _holds(condition, _entry(bucket, key, message))
                    if found is not None:
                        return found
                    log.info("KV %s/%s at revision %d does not %s yet", bucket, key, message.seq, condition.describe())
    except StreamNotFoundError:
        raise bucket_missing(f"KV bucket {bucket!r} key {key!r}") from None
