"""Airflow assets for JetStream streams and subjects: ``jetstream://<server>/<stream>[/<subject>]``.

Registered under ``asset-uris`` in ``get_provider_info`` so Airflow uses :func:`sanitize_uri` for every
``jetstream://`` asset, the hook-lineage collector builds assets with :func:`create_asset`, and the
OpenLineage provider turns them into datasets with :func:`convert_asset_to_openlineage`.

``<server>`` is ``host:port`` of the NATS server (the first one of a cluster's list; the port is
always written, 4222 by default), ``<stream>`` a stream name and ``<subject>`` an optional subject
or subject filter inside it (wildcards ``*``/``>`` allowed)::

    from airflow_jetstream.assets import jetstream_asset

    orders = jetstream_asset("nats.example.com", "ORDERS")          # jetstream://nats.example.com:4222/ORDERS
    new_orders = jetstream_asset("nats.example.com", "ORDERS", "orders.new")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, quote, unquote, urlsplit

from airflow.sdk import Asset
from airflow.sdk.lineage import get_hook_lineage_collector

from airflow_jetstream.client.errors import (
    InvalidKeyError,
    InvalidRequestError,
    InvalidSettingsError,
    InvalidSubjectError,
)
from airflow_jetstream.client.kv.names import check_bucket, validate_key
from airflow_jetstream.client.settings import parse_servers
from airflow_jetstream.client.subjects import validate_name, validate_subject

if TYPE_CHECKING:
    from airflow.providers.common.compat.openlineage.facet import Dataset as OpenLineageDataset

SCHEME = "jetstream"
_SUBJECT_SAFE = ".*>-_~"


class InvalidAssetURIError(InvalidRequestError, ValueError, reason="invalid_asset_uri"):
    """A ``jetstream://`` asset URI is malformed (Airflow expects a ``ValueError`` from URI handlers)."""


@dataclass(frozen=True)
class JetStreamAssetRef:
    """The parts of a sanitised ``jetstream://`` URI."""

    server: str
    stream: str
    subject: str | None = None

    @property
    def uri(self) -> str:
        path = f"/{self.stream}"
        if self.subject:
            path += "/" + quote(self.subject, safe=_SUBJECT_SAFE)
        return f"{SCHEME}://{self.server}{path}"

    @property
    def name(self) -> str:
        """``STREAM`` or ``STREAM/subject``: the dataset name inside the server's namespace."""
        return f"{self.stream}/{self.subject}" if self.subject else self.stream


def _server_authority(server: str) -> str:
    try:
        url = parse_servers(server)[0]
    except InvalidSettingsError as exc:
        raise InvalidAssetURIError(f"jetstream asset: bad server {server!r}: {exc.message}") from None
    return url.split("://", 1)[1].lower()


def _ref(server: str, stream: str, subject: str | None) -> JetStreamAssetRef:
    try:
        validate_name(stream, what="jetstream asset stream")
        if subject is not None:
            validate_subject(subject, allow_wildcards=True, what="jetstream asset subject")
    except InvalidSubjectError as exc:
        raise InvalidAssetURIError(exc.message) from None
    return JetStreamAssetRef(server=_server_authority(server), stream=stream, subject=subject)


def parse_asset_uri(uri: str | SplitResult) -> JetStreamAssetRef:
    """Split and validate ``jetstream://host[:port]/STREAM[/subject]``."""
    parts = urlsplit(uri) if isinstance(uri, str) else uri
    if parts.scheme.lower() != SCHEME:
        raise InvalidAssetURIError(f"not a jetstream asset URI (scheme {parts.scheme!r}); expected '{SCHEME}://'")
    if parts.username or parts.password:
        raise InvalidAssetURIError("jetstream asset URIs must not carry credentials; they live in the connection")
    if parts.query or parts.fragment:
        raise InvalidAssetURIError(f"jetstream asset URI {SCHEME}://{parts.netloc}{parts.path} takes no query or "
                                   "fragment")
    if not parts.netloc or "," in parts.netloc:
        raise InvalidAssetURIError("jetstream asset URI needs exactly one server: "
                                   "jetstream://<host[:port]>/<stream>[/<subject>]")
    stream, _, subject = parts.path.lstrip("/").partition("/")
    if not stream:
        raise InvalidAssetURIError(
            f"jetstream asset URI {SCHEME}://{parts.netloc}{parts.path} names no stream: "
            "jetstream://<host[:port]>/<stream>[/<subject>]"
        )
    return _ref(parts.netloc, unquote(stream), unquote(subject) if subject else None)


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Airflow's ``asset-uris`` handler: validate and normalise (lower-case host, explicit port)."""
    return urlsplit(parse_asset_uri(uri).uri)


def create_asset(*, server: str, stream: str, subject: str | None = None, extra: dict[str, Any] | None = None) -> Asset:
    """Airflow's ``asset-uris`` factory (used by the hook-lineage collector)."""
    ref = _ref(server, stream, subject)
    return Asset(uri=ref.uri, extra=extra or {})


def jetstream_asset(server: str | Sequence[str], stream: str, subject: str | None = None, *,
                    extra: dict[str, Any] | None = None) -> Asset:
    """The asset for a stream (or a subject in it) on a NATS server.

    ``server`` may be ``host``, ``host:port``, a ``nats://``/``tls://`` URL, a comma-separated list or a
    sequence such as ``ConnectionSettings.servers``; the first server identifies the cluster.
    Use it in ``outlets=[...]``, ``inlets=[...]`` and ``schedule=[...]``.
    """
    first = server if isinstance(server, str) else (server[0] if server else "")
    return create_asset(server=first, stream=stream, subject=subject, extra=extra)


def kv_asset(server: str | Sequence[str], bucket: str, key: str | None = None, *,
             extra: dict[str, Any] | None = None) -> Asset:
    """The asset of a KV key (or of the whole bucket when ``key`` is None) on a NATS server, in the ``jetstream://``
    scheme (no scheme of its own; docs/assets.md).

    Bucket ``B`` is the stream ``KV_B`` and its key ``k`` the subject ``$KV.B.k``, so a key is the asset
    ``jetstream://<server>/KV_B/%24KV.B.k`` and a bucket ``jetstream://<server>/KV_B``: ordinary ``jetstream://``
    assets, validated, normalised and turned into OpenLineage datasets like every other:
    ``kv_asset("nats.example.com", "models", "churn.latest")`` is
    ``jetstream://nats.example.com:4222/KV_models/%24KV.models.churn.latest`` (``$`` percent-encoded).
    """
    try:
        check_bucket(bucket)
        if key is not None:
            validate_key(key)
    except InvalidKeyError as exc:
        raise InvalidAssetURIError(exc.message) from None
    return jetstream_asset(server, f"KV_{bucket}", f"$KV.{bucket}.{key}" if key is not None else None, extra=extra)


def _report(task: Any, attribute: str, servers: str | Sequence[str], stream: str, subject: str | None,
            context: Any) -> Asset:
    asset = jetstream_asset(servers, stream, subject)
    server = asset.uri.split("://", 1)[1].split("/", 1)[0]
    collector = get_hook_lineage_collector()
    add = collector.add_output_asset if attribute == "outlets" else collector.add_input_asset
    add(context=task if context is None else context, scheme=SCHEME,
        asset_kwargs={"server": server, "stream": stream, "subject": subject})
    declared = getattr(task, attribute)
    if all(not isinstance(a, Asset) or a.uri != asset.uri for a in declared):
        setattr(task, attribute, [*declared, asset])
    return asset


def report_stream_output(task: Any, servers: str | Sequence[str], stream: str, subject: str | None = None, *,
                         lineage_context: Any = None) -> Asset:
    """For operators: add the stream (or subject) to ``task.outlets`` and report it to hook lineage.

    Call it from ``execute()`` once the connection's servers are known (``self.hook.settings.servers``).
    The asset is added once, so retries do not duplicate it; when the task succeeds Airflow records an
    asset event, which runs the DAGs scheduled on that asset. ``lineage_context`` is what the
    hook-lineage collector attributes the output to (the hook, typically); default ``task``.
    """
    return _report(task, "outlets", servers, stream, subject, lineage_context)


def report_stream_input(task: Any, servers: str | Sequence[str], stream: str, subject: str | None = None, *,
                        lineage_context: Any = None) -> Asset:
    """For operators that read a stream: the same as :func:`report_stream_output`, for ``task.inlets``."""
    return _report(task, "inlets", servers, stream, subject, lineage_context)


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> OpenLineageDataset:
    """Airflow's ``asset-uris`` OpenLineage converter.

    The dataset's namespace is ``jetstream://host:port`` and its name ``STREAM`` or ``STREAM/subject``.
    """
    from airflow.providers.common.compat.openlineage.facet import Dataset as OpenLineageDataset

    ref = parse_asset_uri(asset.uri)
    return OpenLineageDataset(namespace=f"{SCHEME}://{ref.server}", name=ref.name)


__all__ = ["SCHEME", "InvalidAssetURIError", "JetStreamAssetRef", "convert_asset_to_openlineage", "create_asset",
           "jetstream_asset", "kv_asset", "parse_asset_uri", "report_stream_input", "report_stream_output",
           "sanitize_uri"]
