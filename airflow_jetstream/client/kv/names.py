"""Bucket names and keys as nats accepts them, and the stream behind a bucket (no connection needed)."""

from __future__ import annotations

import re
from typing import Any

from airflow_jetstream.client.errors import InvalidKeyError

_BUCKET = re.compile(r"^[a-zA-Z0-9_-]+$")
_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")


def check_bucket(bucket: Any) -> str:
    if not isinstance(bucket, str) or not _BUCKET.match(bucket):
        raise InvalidKeyError(f"KV bucket name {bucket!r} is not valid; use letters, digits, '_' and '-' only",
                              reason="invalid_bucket")
    return bucket


def stream_of(bucket: str) -> str:
    """The stream behind a bucket: ``KV_<bucket>``."""
    return f"KV_{check_bucket(bucket)}"


def validate_key(key: Any) -> str:
    """``key`` if nats accepts it as a KV key, else :class:`InvalidKeyError`."""
    if not isinstance(key, str) or not _KEY.match(key) or key.startswith(".") or key.endswith("."):
        raise InvalidKeyError(f"KV key {key!r} is not valid: use letters, digits and '-/_=.' (not first or last "
                              "'.'), no spaces or wildcards")
    return key
