"""Write and read keys of a KV bucket: put, create (only if absent), update at a revision, delete, get.

Values: ``bytes`` as they are, ``str`` as UTF-8, anything else (dict, list, number, bool) as JSON.
Entries are returned as JSON-able dicts: ``{"bucket", "key", "revision", "value", "encoding",
"json", "operation", "created"}`` where ``value`` is the UTF-8 text (base64 for binary values) and
``json`` the parsed value when it is JSON.
"""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

import nats.js.errors

from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import InvalidRequestError, KeyRevisionError
from airflow_jetstream.client.kv.bucket import open_bucket
from airflow_jetstream.client.kv.errors import kv_errors
from airflow_jetstream.client.kv.names import validate_key


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


def entry_dict(bucket: str, key: str, revision: int | None, data: bytes | None, *, operation: str | None = None,
               created: Any = None) -> dict[str, Any]:
    """The JSON-able form of a KV entry."""
    data = data or b""
    try:
        value, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        value, encoding = base64.b64encode(data).decode("ascii"), "base64"
    entry: dict[str, Any] = {"bucket": bucket, "key": key, "revision": revision, "value": value,
                             "encoding": encoding, "operation": operation or "PUT",
                             "created": created.isoformat() if hasattr(created, "isoformat") else created}
    if encoding == "utf-8":
        with contextlib.suppress(ValueError):
            entry["json"] = json.loads(value)
    return entry


async def _current_revision(kv: Any, key: str) -> int | None:
    try:
        revision: int | None = (await kv.get(key)).revision
        return revision
    except nats.js.errors.KeyNotFoundError:
        return None


async def get_key(conn: JetStreamConnection, bucket: str, key: str) -> dict[str, Any] | None:
    """The key's current entry, or None when it does not exist (never written, deleted or purged)."""
    validate_key(key)
    kv = await open_bucket(conn, bucket)
    async with kv_errors(conn, bucket, f"KV bucket {bucket!r} key {key!r}"):
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
    return entry_dict(bucket, key, entry.revision, entry.value)


async def put_key(conn: JetStreamConnection, bucket: str, key: str, value: Any) -> dict[str, Any]:
    """Write ``value`` whatever the key holds; returns ``{"bucket", "key", "operation", "revision"}``."""
    validate_key(key)
    data = encode_value(value)
    kv = await open_bucket(conn, bucket)
    async with kv_errors(conn, bucket, f"KV bucket {bucket!r} key {key!r}"):
        revision = await kv.put(key, data)
    return {"bucket": bucket, "key": key, "operation": "put", "revision": revision}


async def create_key(conn: JetStreamConnection, bucket: str, key: str, value: Any) -> dict[str, Any]:
    """Write ``value`` only if the key does not exist (a deleted key may be created again)."""
    validate_key(key)
    data = encode_value(value)
    kv = await open_bucket(conn, bucket)
    async with kv_errors(conn, bucket, f"KV bucket {bucket!r} key {key!r}"):
        try:
            revision = await kv.create(key, data)
        except nats.js.errors.KeyWrongLastSequenceError:
            current = await _current_revision(kv, key)
            raise KeyRevisionError(f"KV bucket {bucket!r}: key {key!r} already exists (revision {current}); use "
                                   "put to overwrite it or update with that revision", reason="key_exists") from None
    return {"bucket": bucket, "key": key, "operation": "create", "revision": revision}


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
    data = encode_value(value)
    kv = await open_bucket(conn, bucket)
    async with kv_errors(conn, bucket, f"KV bucket {bucket!r} key {key!r}"):
        try:
            new_revision = await kv.update(key, data, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            current = await _current_revision(kv, key)
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
    kv = await open_bucket(conn, bucket)
    async with kv_errors(conn, bucket, f"KV bucket {bucket!r} key {key!r}"):
        try:
            if purge:
                await kv.purge(key)
            else:
                await kv.delete(key, last=revision)
        except nats.js.errors.APIError as exc:
            if exc.err_code not in (10071, 10164):
                raise
            current = await _current_revision(kv, key)
            raise KeyRevisionError(f"KV bucket {bucket!r}: key {key!r} is at revision {current}, not {revision}; "
                                   "nothing was deleted", reason="wrong_revision") from None
    return {"bucket": bucket, "key": key, "operation": "purge" if purge else "delete", "revision": revision}
