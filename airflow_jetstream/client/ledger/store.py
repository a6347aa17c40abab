"""The ledger bucket on the wire: the last value of keys in one direct get, and writes that are
compare-and-set on every key they touch, several keys as one atomic batch.

A write names, for each key, the sequence its last value had when it was read (0: the key must not
exist); the server checks all of them when the batch commits (``Nats-Expected-Last-Subject-Sequence``
on each message) and stores all of the batch or nothing (nats-server 2.12+, the bucket's stream needs
``allow_atomic``). A moved key is :class:`CasConflict`: read again and decide again.

A write that got no answer may or may not be stored: callers read again and compare (the ledger's
transitions do), they never send the same write twice blindly.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    BatchPublishError,
    JetStreamError,
    JetStreamNotEnabledError,
    LedgerConflictError,
    LedgerNotFoundError,
    error_from_api,
)
from airflow_jetstream.client.kv import errors
from airflow_jetstream.client.reading.direct import get_message, last_per_subject
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


class CasConflict(Exception):
    """A key moved since it was read (the server's wrong last sequence): nothing of the write was stored."""


@dataclass(frozen=True)
class Entry:
    """The last value of a ledger key: ``seq`` is its revision; ``deleted`` for a delete or purge marker."""

    key: str
    seq: int
    data: bytes
    deleted: bool


@dataclass(frozen=True)
class Write:
    """Put ``data`` under ``key`` if the key's last revision is still ``expected`` (0: the key must not exist)."""

    key: str
    data: bytes
    expected: int


def kv_errors(conn: JetStreamConnection, bucket: str, context: str, *,
              fail_fast: bool = True) -> AbstractAsyncContextManager[None]:
    """The KV wing's one error mapping (:func:`~airflow_jetstream.client.kv.errors.kv_errors`: permission refusals
    fail fast naming the subject) for the ledger's calls on ``bucket``, a missing bucket reported as the ledger's."""
    return errors.kv_errors(conn, bucket, context, fail_fast=fail_fast, missing=lambda where: LedgerNotFoundError(
        f"{where}: the ledger bucket does not exist; open it with create=True"))


def stream_of(bucket: str) -> str:
    return f"KV_{bucket}"


def subject_of(bucket: str, key: str) -> str:
    return f"$KV.{bucket}.{key}"


async def read_last(conn: JetStreamConnection, bucket: str, keys: Sequence[str], *,
                    leader: bool = False) -> dict[str, Entry]:
    """The last value of each key matching ``keys`` (keys and key filters with ``*``/``>``), by key; keys never
    written are absent. One direct get, answered by any replica: one still applying the latest writes may answer
    an older value. ``leader`` (literal keys only) asks the stream leader instead, one message get per key at
    once, for reads that must see every write made before them."""
    prefix = subject_of(bucket, "")
    if leader:
        found = await asyncio.gather(*(get_message(conn, stream_of(bucket), subject=prefix + key) for key in keys))
        messages = {msg.subject: msg for msg in found if msg is not None}
    else:
        messages = await last_per_subject(conn, stream_of(bucket), [prefix + key for key in keys])
    return {subject[len(prefix):]: Entry(key=subject[len(prefix):], seq=msg.seq, data=msg.data,
                                         deleted=_is_marker(msg.headers))
            for subject, msg in messages.items()}


def _is_marker(headers: dict[str, str] | None) -> bool:
    if not headers:
        return False
    return headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers


async def write(conn: JetStreamConnection, bucket: str, writes: Sequence[Write], *, context: str) -> int:
    """Store every write or none, each only if its key is still at its expected revision; returns the stream
    sequence of the last one (the others precede it in order). Raises :class:`CasConflict` when a key moved.
    A batch the server turned away because it is busy is sent again (nothing of it was stored)."""

    def busy(exc: JetStreamError) -> str | None:
        return exc.message if exc.reason == _BUSY else None

    async with kv_errors(conn, bucket, context):  # a refused publish names the first subject refused
        return await retry(context, lambda: _send(conn, bucket, writes, context), transient=busy,
                           budget=conn.settings.leader_wait, backoff=BUSY)


async def _send(conn: JetStreamConnection, bucket: str, writes: Sequence[Write], context: str) -> int:
    batch_id = uuid.uuid4().hex
    last = len(writes)
    reply = None
    for number, item in enumerate(writes, start=1):
        headers = {"Nats-Expected-Last-Subject-Sequence": str(item.expected)}
        if last > 1:
            headers.update({"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(number)})
            if number == last:
                headers["Nats-Batch-Commit"] = "1"
        subject = subject_of(bucket, item.key)
        if number < last:
            await conn.nc.publish(subject, item.data, headers=headers)  # answered by the commit's ack
        else:
            try:
                reply = await conn.request(subject, item.data, headers=headers)
            except JetStreamNotEnabledError:  # no responder: no stream stores the key (or, on a cluster, no leader)
                if conn.clustered:
                    raise conn.unanswered(f"{context}: no stream leader answered {subject!r}") from None
                raise LedgerNotFoundError(f"{context}: the ledger bucket {bucket!r} does not exist") from None
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
