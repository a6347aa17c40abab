"""Assets for KV buckets and keys, in the ``jetstream://`` scheme (no scheme of their own; docs/assets.md).

Bucket ``B`` is the stream ``KV_B`` and its key ``k`` the subject ``$KV.B.k``, so a key is the asset
``jetstream://<server>/KV_B/%24KV.B.k`` and a bucket ``jetstream://<server>/KV_B``: ordinary
``jetstream://`` assets, validated, normalised and turned into OpenLineage datasets like every other:
``kv_asset("nats.example.com", "models", "churn.latest")`` is
``jetstream://nats.example.com:4222/KV_models/%24KV.models.churn.latest`` (``$`` percent-encoded).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Asset

from airflow_jetstream.assets.jetstream import InvalidAssetURIError, jetstream_asset
from airflow_jetstream.client.errors import InvalidKeyError
from airflow_jetstream.client.kv.names import check_bucket, validate_key


def kv_asset(server: str | Sequence[str], bucket: str, key: str | None = None, *,
             extra: dict[str, Any] | None = None) -> Asset:
    """The asset of a KV key (or of the whole bucket when ``key`` is None) on a NATS server."""
    try:
        check_bucket(bucket)
        if key is not None:
            validate_key(key)
    except InvalidKeyError as exc:
        raise InvalidAssetURIError(exc.message) from None
    return jetstream_asset(server, f"KV_{bucket}", f"$KV.{bucket}.{key}" if key is not None else None, extra=extra)


__all__ = ["kv_asset"]
