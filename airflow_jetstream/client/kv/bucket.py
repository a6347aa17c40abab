"""Ensure a KV bucket exists with the given config (created, updated in place, or left alone); the replicas and
placement of every bucket the provider creates (the user's, the batch ledger's, the job records'); and the one
mapping of nats-py KV/JetStream exceptions to the toolkit's typed errors for every KV call.

A bucket ``B`` is the stream ``KV_B`` holding subjects ``$KV.B.<key>``; its ``history`` is the stream's
``max_msgs_per_subject`` and its ``ttl`` the stream's ``max_age``. Fields not given keep their current values on
an existing bucket (a re-run never changes replicas it was not told to). Unset replication gives a new bucket
:func:`~airflow_jetstream.client.admin.streams.default_replicas` (3 on a cluster).

A bucket is created as nats-py's ``create_key_value`` creates one (:func:`kv_stream_config`), but through the
toolkit's own :func:`~airflow_jetstream.client.admin.streams.ensure_stream`, with the placement nats-py (2.16) leaves
out. A permissions violation of a publish reaches the toolkit only as the server's asynchronous ``-ERR``: while a
call runs (:func:`kv_errors`), such a refusal of one of the bucket's subjects ends it at once with
``permission_denied`` naming the subject, instead of a timeout after ``request_timeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import nats.errors

from airflow_jetstream.client.admin.streams import default_replicas, ensure_stream, replication_config
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    BucketNotFoundError,
    InvalidRequestError,
    JetStreamError,
    PermissionDeniedError,
    StreamConfigError,
)
from airflow_jetstream.client.kv.names import check_bucket, stream_of

MAX_HISTORY = 64
#: nats-py's duplicate window of a bucket's stream: 2 minutes, or the bucket's ``ttl`` when shorter.
DUPLICATE_WINDOW = 120.0


def bucket_missing(context: str) -> JetStreamError:
    """The KV API's error for a bucket that does not exist."""
    return BucketNotFoundError(f"{context}: the bucket does not exist; create it first (the KV operator ensures it, "
                               "or ensure_bucket)")


def _concerns(subject: str, bucket: str) -> bool:
    """Whether ``subject`` (lowercased by nats-py) is one of ``bucket``'s KV or stream API subjects."""
    subject, bucket = subject.lower(), bucket.lower()
    return subject.startswith(f"$kv.{bucket}.") or subject.endswith(f".kv_{bucket}") or f".kv_{bucket}." in subject


def _original_case(conn: JetStreamConnection, subject: str, bucket: str) -> str:
    """The refused subject with the API prefix, API verbs and bucket spelled as sent (nats-py lowercases the
    -ERR text; a key keeps the server's lowercase)."""
    prefix = conn.api_prefix
    if subject.lower().startswith(prefix.lower() + "."):
        tokens = subject[len(prefix) + 1:].split(".")
        verbs = next((i for i, t in enumerate(tokens) if t.lower() == f"kv_{bucket.lower()}"), 0)
        subject = ".".join([prefix, *(t.upper() for t in tokens[:verbs]), *tokens[verbs:]])
    for lower, original in ((f"$kv.{bucket.lower()}.", f"$KV.{bucket}."), (f"kv_{bucket.lower()}", f"KV_{bucket}")):
        at = subject.lower().find(lower)
        if at >= 0:
            subject = subject[:at] + original + subject[at + len(lower):]
    return subject


def _denied(conn: JetStreamConnection, subject: str, bucket: str) -> PermissionDeniedError:
    shown = _original_case(conn, subject, bucket)
    return PermissionDeniedError(
        f"permission denied: this NATS user may not use {shown!r} (KV bucket {bucket!r}); grant it in the "
        "server's authorization config or use another user", subject=shown)


@asynccontextmanager
async def kv_errors(conn: JetStreamConnection, bucket: str, context: str, *,
                    fail_fast: bool = True) -> AsyncIterator[None]:
    """Turn a refusal of one of ``bucket``'s subjects while the body runs, and a nats-py exception it raises (the
    toolkit's own requests raise typed errors already), into typed errors naming ``context``.

    ``fail_fast`` cancels the body on a refusal: turn it off around a ``yield`` (the body's task runs the
    caller's code there), where the toolkit's own requests fail fast anyway.
    """
    task = asyncio.current_task() if fail_fast else None
    refused: list[str] = []

    def on_denied(subject: str) -> None:
        if task is not None and not refused and _concerns(subject, bucket):
            refused.append(subject)
            task.cancel()

    conn.denial_listeners.append(on_denied)
    try:
        yield
    except BaseException as exc:
        if refused:
            if isinstance(exc, asyncio.CancelledError) and task is not None and task.uncancel() > 0:
                raise  # cancelled from outside as well
            conn.take_violation(refused[0].__eq__)  # reported here, so no later failure reads it as its own
            raise _denied(conn, refused[0], bucket) from None
        if isinstance(exc, JetStreamError) or not isinstance(exc, nats.errors.Error):
            raise
        raise JetStreamError(f"{context}: {type(exc).__name__}: {exc}") from None  # e.g. the connection closed
    finally:
        conn.denial_listeners.remove(on_denied)


def _check_history(history: Any) -> int | None:
    if history is None:
        return None
    if isinstance(history, bool) or not isinstance(history, int) or not 1 <= history <= MAX_HISTORY:
        raise InvalidRequestError(f"history must be a whole number from 1 to {MAX_HISTORY}, got {history!r}",
                                  reason="invalid_option")
    return history


async def ensure_bucket(conn: JetStreamConnection, bucket: str, *, history: int | None = None,
                        ttl: float | str | timedelta | None = None, num_replicas: int | None = None,
                        max_value_size: int | None = None, max_bytes: int | None = None, storage: str | None = None,
                        description: str | None = None, placement: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create the bucket, update the given fields where they differ, or leave it alone.

    ``ttl`` is seconds (or a timedelta, or a string like ``"7d"``) after which values expire. A new
    bucket without ``num_replicas`` gets 3 replicas on a cluster, else 1 (``default_replicas``).
    ``placement`` (``{"cluster": ..., "tags": [...]}``) puts its replicas on matching servers; one
    the cluster cannot meet is :class:`~airflow_jetstream.client.errors.PlacementError`, nothing created.
    Returns ``{"bucket", "action": "created" | "updated" | "unchanged", "changed", "history", "ttl",
    "num_replicas", "placement", "storage", "values"}``.
    """
    check_bucket(bucket)
    history = _check_history(history)
    replication = replication_config(num_replicas, placement)
    if storage is not None and storage not in ("file", "memory"):
        raise InvalidRequestError(f"storage must be 'file' or 'memory', got {storage!r}", reason="invalid_option")
    ttl_seconds = None if ttl is None else to_seconds(ttl, field="ttl")
    wanted = {"max_msgs_per_subject": history, "max_age": ttl_seconds, "max_msg_size": max_value_size,
              "max_bytes": max_bytes, "storage": storage, "description": description, **replication}
    wanted = {k: v for k, v in wanted.items() if v is not None}
    result = await ensure_kv_stream(conn, bucket, wanted, ttl=ttl_seconds, context=f"KV bucket {bucket!r}")
    action, changed = result["action"], sorted(wanted) if result["action"] == "created" else result["changed"]
    cfg = result["info"]["config"]
    placement = {k: v for k, v in (cfg.get("placement") or {}).items() if k in ("cluster", "tags") and v}
    return {"bucket": bucket, "action": action, "changed": changed, "history": cfg.get("max_msgs_per_subject"),
            "ttl": cfg.get("max_age", 0) / 1e9 or None, "num_replicas": cfg.get("num_replicas", 1),
            "placement": placement or None, "storage": cfg.get("storage"),
            "values": result["info"]["state"].get("messages", 0)}


def kv_stream_config(bucket: str, *, history: int = 1, ttl: float | None = None) -> dict[str, Any]:
    """The stream config nats-py's ``create_key_value`` gives a new bucket keeping ``history`` values per key, each
    ``ttl`` seconds (None: forever): what every KV client expects of a bucket's stream."""
    window = min(DUPLICATE_WINDOW, ttl) if ttl else DUPLICATE_WINDOW
    return {"subjects": [f"$KV.{bucket}.>"], "max_msgs_per_subject": history, "allow_rollup_hdrs": True,
            "allow_msg_ttl": True, "deny_delete": True, "discard": "new", "duplicate_window": window,
            "max_consumers": -1, "max_msgs": -1, **({"max_age": ttl} if ttl else {})}


async def ensure_kv_stream(conn: JetStreamConnection, bucket: str, wanted: Mapping[str, Any], *, context: str,
                           history: int = 1, ttl: float | None = None,
                           description: str | None = None) -> dict[str, Any]:
    """:func:`~airflow_jetstream.client.admin.streams.ensure_stream` of the bucket's stream (errors as
    :func:`kv_errors` gives them): ``wanted`` (stream fields) on a new or an existing bucket, the rest of a new one
    as :func:`kv_stream_config` and ``default_replicas`` give it. A bucket another writer created meanwhile with
    another config is brought to ``wanted`` like any existing one."""
    config = {"name": stream_of(bucket), **wanted}
    defaults = {**kv_stream_config(bucket, history=history, ttl=ttl), "num_replicas": default_replicas(conn),
                **({"description": description} if description else {})}
    async with kv_errors(conn, bucket, context):
        try:
            return await ensure_stream(conn, config, create_defaults=defaults)
        except StreamConfigError as exc:
            if exc.reason != "stream_name_in_use":
                raise
            return await ensure_stream(conn, config)
