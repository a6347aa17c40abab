"""Stream administration: idempotent create-or-update, info, purge, the first message at a time, the stream
that captures a subject, and views of a connection on another JetStream domain.

Every function takes a :class:`JetStreamConnection`; for a stream in another domain (a leaf node) or behind another
API prefix, a view of it: ``await consumer_info(api_view(conn, domain="edge"), "ORIGIN", "AGG_SRC")``.
"""

from __future__ import annotations

import copy
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client import server_features
from airflow_jetstream.client.durations import to_nanos, to_rfc3339
from airflow_jetstream.client.errors import (
    InvalidRequestError,
    JetStreamError,
    JetStreamNotEnabledError,
    PlacementError,
    ServerAPIError,
    StreamConfigError,
    StreamNotFoundError,
    error_from_api,
)
from airflow_jetstream.client.retry import Deadline
from airflow_jetstream.client.subjects import (
    fence_namespace,
    fence_subject,
    subject_matches,
    validate_name,
    validate_subject,
    validate_subjects,
)

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

#: Stream configuration fields of the JetStream API (nats-server 2.15), by their JSON names.
STREAM_CONFIG_FIELDS = frozenset({
    "name", "description", "subjects", "retention", "max_consumers", "max_msgs", "max_bytes",
    "max_age", "max_msgs_per_subject", "max_msg_size", "discard", "discard_new_per_subject",
    "storage", "num_replicas", "no_ack", "duplicate_window", "placement", "mirror", "sources",
    "sealed", "deny_delete", "deny_purge", "allow_rollup_hdrs", "allow_direct", "mirror_direct",
    "republish", "subject_transform", "compression", "first_seq", "metadata", "consumer_limits",
    "allow_msg_ttl", "subject_delete_marker_ttl", "allow_atomic", "allow_batched",
    "allow_msg_counter", "allow_msg_schedules", "persist_mode",
})
DURATION_FIELDS = ("max_age", "duplicate_window", "subject_delete_marker_ttl")
#: Fields the server refuses to change once the stream exists.
IMMUTABLE_FIELDS = ("storage", "mirror", "first_seq")
_ENUMS = {
    "retention": ("limits", "interest", "workqueue"),
    "storage": ("file", "memory"),
    "discard": ("old", "new"),
    "compression": ("none", "s2"),
}
_DEFAULTS = {"retention": "limits", "storage": "file", "discard": "old", "num_replicas": 1}
#: The server's limit on replicas per stream.
MAX_REPLICAS = 5
#: Replicas of what the provider creates on a cluster when not told otherwise.
CLUSTER_REPLICAS = 3
_PLACEMENT_KEYS = ("cluster", "tags")
log = logging.getLogger(__name__)
#: Connections whose server names a cluster but refused replicas (JetStream runs unclustered there).
_UNCLUSTERED: weakref.WeakSet[JetStreamConnection] = weakref.WeakSet()


def check_replicas(value: Any, *, what: str = "num_replicas") -> int | None:
    """``value`` as a replica count 1..5, None when unset; :class:`InvalidRequestError` otherwise."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS:
        raise InvalidRequestError(f"{what} must be an integer from 1 to {MAX_REPLICAS}, got {value!r}",
                                  reason="invalid_replicas")
    return value


def normalize_placement(placement: Any) -> dict[str, Any] | None:
    """``{"cluster": name, "tags": [...]}`` (either key optional), None when unset or empty.

    ``tags`` may be a list or a comma-separated string (for templated values).
    """
    if placement is None or placement == {}:
        return None
    if not isinstance(placement, dict) or set(placement) - set(_PLACEMENT_KEYS):
        raise InvalidRequestError(
            f"placement must be a dict with 'cluster' and/or 'tags' (e.g. {{'tags': ['az:a']}}), got {placement!r}",
            reason="invalid_placement")
    out: dict[str, Any] = {}
    cluster = placement.get("cluster")
    if cluster:
        if not isinstance(cluster, str):
            raise InvalidRequestError(f"placement cluster must be a name, got {cluster!r}", reason="invalid_placement")
        out["cluster"] = cluster
    tags = placement.get("tags")
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",") if t.strip()]
    if tags:
        if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) and t for t in tags):
            raise InvalidRequestError(f"placement tags must be a list of strings, got {tags!r}",
                                      reason="invalid_placement")
        out["tags"] = list(tags)
    return out or None


def replication_config(num_replicas: Any = None, placement: Any = None) -> dict[str, Any]:
    """The ``num_replicas``/``placement`` stream fields that were given (validated); unset ones are left out."""
    given = {"num_replicas": check_replicas(num_replicas), "placement": normalize_placement(placement)}
    return {key: value for key, value in given.items() if value is not None}


def default_replicas(conn: JetStreamConnection) -> int:
    """Replicas for something the provider creates unasked: 3 when the connected server is part of a
    cluster, else 1 (an existing stream keeps its own). A stream created with it logs it (:func:`_create_stream`),
    so ensuring what exists says nothing.

    A cluster is recognised by the ``cluster`` name in the server's INFO, which every clustered server sends
    (also with ``no_advertise``). Live servers are not counted: with one of three nodes down a new stream is
    still meant to be R3. A lone server with a ``cluster`` block runs JetStream unclustered and refuses R3
    (10074); :func:`ensure_stream` then creates with 1 replica and this connection defaults to 1 from then on.
    """
    from airflow_jetstream.client.natspy_internals import server_info  # imports nats-py: DAG files import this module

    info = server_info(conn.nc)
    cluster = info.get("cluster")
    return CLUSTER_REPLICAS if cluster and conn not in _UNCLUSTERED else 1


def normalize_stream_config(config: dict[str, Any]) -> dict[str, Any]:
    """Validate a stream config locally and convert durations to nanoseconds.

    Raises :class:`StreamConfigError` for unknown keys or bad values before anything is sent.
    """
    cfg = known_fields(config, "stream", STREAM_CONFIG_FIELDS, StreamConfigError,
                       " (e.g. num_replicas, max_age, duplicate_window, allow_atomic)")
    if "name" not in cfg:
        raise StreamConfigError("a stream config needs a 'name'", reason="missing_name")
    try:
        validate_name(cfg["name"], what="stream name")
        validate_subjects(cfg.get("subjects") or [], what="stream subjects")
        for key in DURATION_FIELDS:
            if key in cfg and cfg[key] is not None:
                cfg[key] = to_nanos(cfg[key], field=key)
        if cfg.get("num_replicas") is not None:
            cfg["num_replicas"] = check_replicas(cfg["num_replicas"])
        if "placement" in cfg:
            cfg["placement"] = normalize_placement(cfg["placement"])
    except InvalidRequestError as exc:
        raise StreamConfigError(exc.message, reason=exc.reason) from None
    if isinstance(cfg.get("subjects"), str):
        raise StreamConfigError("'subjects' must be a list of subjects, not a string", reason="invalid_field")
    check_choices(cfg, _ENUMS, StreamConfigError)
    if cfg.get("mirror") and cfg.get("subjects"):
        raise StreamConfigError("a mirror stream cannot have subjects of its own", reason="invalid_field")
    if cfg.get("allow_atomic") and cfg.get("persist_mode") == "async":
        raise StreamConfigError("allow_atomic cannot be combined with persist_mode 'async'", reason="invalid_field")
    return cfg


def known_fields(config: Any, kind: str, fields: frozenset[str], error: type[JetStreamError],
                 example: str = "") -> dict[str, Any]:
    """A deep copy of ``config``, which must be a dict of JetStream's JSON field names (a stream's or a consumer's,
    ``kind``); ``error`` is the config's error type."""
    if not isinstance(config, dict):
        raise error(f"a {kind} config must be a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - fields)
    if unknown:
        raise error(f"unknown {kind} config field(s) {', '.join(unknown)}; use JetStream's JSON names{example}",
                    reason="unknown_field")
    return copy.deepcopy(config)


def check_choices(cfg: Mapping[str, Any], choices: Mapping[str, Sequence[str]], error: type[JetStreamError]) -> None:
    for key, allowed in choices.items():
        if key in cfg and cfg[key] not in allowed:
            raise error(f"{key}={cfg[key]!r} is not valid; use one of {', '.join(allowed)}", reason="invalid_field")


def restated(exc: JetStreamError, message: str, *, error: type[JetStreamError] | None = None,
             reason: str | None = None) -> JetStreamError:
    """``exc`` (a server's refusal) with another message, keeping its codes and the server's description."""
    return (error or type(exc))(message, reason=reason or exc.reason, code=exc.code, err_code=exc.err_code,
                                description=exc.description)


async def _name_overlapping_streams(conn: JetStreamConnection, exc: StreamConfigError, name: str,
                                    cfg: dict[str, Any]) -> JetStreamError:
    """``exc`` naming the streams that already capture the subjects (the server's own matching), when the server
    refused an overlap."""
    if exc.reason != "subjects_overlap":
        return exc
    overlaps = []
    for subject in cfg.get("subjects") or []:
        reply = await conn.api_request("STREAM.NAMES", {"subject": subject}, context=f"streams for {subject!r}")
        others = [stream for stream in reply.get("streams") or [] if stream != name]
        if others:
            overlaps.append(f"{subject!r} overlaps stream(s) {', '.join(map(repr, others))}")
    if not overlaps:
        return exc
    return restated(exc, f"stream {name!r}: {'; '.join(overlaps)}. A subject can be captured by one stream only: "
                    "narrow the subjects, or use the existing stream")


async def stream_info(conn: JetStreamConnection, name: str) -> dict[str, Any]:
    """Stream info (config + state), or :class:`StreamNotFoundError`."""
    validate_name(name, what="stream name")
    return await conn.api_request(f"STREAM.INFO.{name}", context=f"stream {name!r}")


async def list_pages(conn: JetStreamConnection, api: str, key: str, context: str, *,
                     limit: int | None = None) -> tuple[list[dict[str, Any]], int, list[str]]:
    """Every item of a paged API listing (``STREAM.LIST``, ``CONSUMER.LIST.<stream>``; the server pages them by
    256) up to ``limit``: (items, total, names a clustered server listed as missing: no answer from their leader)."""
    items: list[dict[str, Any]] = []
    missing: list[str] = []
    total = 0
    while limit is None or len(items) < limit:
        reply = await conn.api_request(api, {"offset": len(items)}, context=context)
        page = reply.get(key) or []
        total = max(int(reply.get("total") or 0), len(items) + len(page))
        missing.extend(str(name) for name in reply.get("missing") or [])
        items.extend(page)
        if not page or len(items) >= total:
            break
    return items[:limit], total, missing


async def find_stream(conn: JetStreamConnection, name: str) -> dict[str, Any] | None:
    """Stream info, or None when the stream does not exist."""
    try:
        return await stream_info(conn, name)
    except StreamNotFoundError:
        return None


def with_fence_subjects(cfg: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
    """``cfg`` with the fence namespace ``_FENCE.<name>.>`` added to the subjects of a stream that takes atomic
    batches (``allow_atomic``, in ``cfg`` or the ``current`` config it updates) and keeps what it stores (limits
    or workqueue retention), so atomic writes to it are exactly once (:mod:`~airflow_jetstream.client.batches.atomic`);
    a stream whose subjects already cover it, or that has none of its own, is left as it is."""
    subjects = cfg.get("subjects")
    merged = {**(current or {}), **cfg}
    if not merged.get("allow_atomic") or not subjects or merged.get("retention", "limits") == "interest":
        return cfg
    probe = fence_subject(cfg["name"], "x")
    if any(subject_matches(pattern, probe) for pattern in subjects):
        return cfg
    return {**cfg, "subjects": [*subjects, fence_namespace(cfg["name"])]}


async def _create_stream(conn: JetStreamConnection, cfg: dict[str, Any], *, replicas_defaulted: bool) -> dict[str, Any]:
    """``STREAM.CREATE`` with ``cfg``; logs the replicas it got. When the replicas were defaulted
    (:func:`default_replicas`) and the server turns out to run JetStream unclustered, it is created with 1."""
    name = cfg["name"]
    try:
        info = await conn.api_request(f"STREAM.CREATE.{name}", cfg, context=f"create stream {name!r}")
    except PlacementError as exc:
        if not replicas_defaulted or exc.reason != "replicas_need_cluster":
            raise
        _UNCLUSTERED.add(conn)
        log.warning("stream %s: the server names a cluster but runs JetStream unclustered (%s); creating it "
                    "with 1 replica", name, exc.description)
        info = await conn.api_request(f"STREAM.CREATE.{name}", {**cfg, "num_replicas": 1},
                                      context=f"create stream {name!r}")
    replicas = (info.get("config") or {}).get("num_replicas", 1)
    log.info("created stream %s with %s replica(s)%s", name, replicas, "" if not replicas_defaulted else
             " (the default: the server is part of a cluster)" if replicas > 1 else " (the default)")
    return info


async def ensure_stream(conn: JetStreamConnection, config: dict[str, Any], *,
                        create_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create the stream, update it where it differs, or leave it alone.

    Returns ``{"action": "created" | "updated" | "unchanged", "changed": [...], "info": {...}}``.
    Fields not named in ``config`` keep their current values on update; ``create_defaults`` only
    fill fields ``config`` leaves out when the stream is created (e.g. a default ``num_replicas``).
    """
    cfg = normalize_stream_config(config)
    name = cfg["name"]
    server_features.check_stream_config(conn, cfg)
    current = await find_stream(conn, name)
    cfg = with_fence_subjects(cfg, None if current is None else current["config"])
    if current is None:
        defaulted = "num_replicas" not in cfg and "num_replicas" in (create_defaults or {})
        cfg = {**normalize_stream_config({"name": name, **(create_defaults or {})}), **cfg}
        try:
            info = await _create_stream(conn, cfg, replicas_defaulted=defaulted)
        except StreamConfigError as exc:
            raise await _name_overlapping_streams(conn, exc, name, cfg) from None
        dropped = server_features.dropped_fields(cfg, info.get("config", {}))
        if dropped:  # an old server that ignores unknown fields: remove what it made of the request
            await conn.api_request(f"STREAM.DELETE.{name}", context=f"delete stream {name!r}")
            raise server_features.unknown_fields_error(conn, name, dropped)
        return {"action": "created", "changed": sorted(cfg), "info": info}
    current_cfg = current["config"]
    changed = changed_fields(cfg, current_cfg, defaults=_DEFAULTS)
    if not changed:
        return {"action": "unchanged", "changed": [], "info": current}
    for key in IMMUTABLE_FIELDS:
        if key in changed:
            raise StreamConfigError(
                f"stream {name!r}: field {key!r} cannot be changed on an existing stream "
                f"(is {current_cfg.get(key)!r}, requested {cfg[key]!r}); create a new stream and "
                "migrate, or keep the current value", reason="immutable_field")
    merged = {**current_cfg, **cfg}
    try:
        info = await conn.api_request(f"STREAM.UPDATE.{name}", merged, context=f"update stream {name!r}")
    except StreamConfigError as refused:
        named = await _name_overlapping_streams(conn, refused, name, cfg)
        raise restated(named, f"{named.message} (changing {', '.join(changed)})") from None
    dropped = server_features.dropped_fields({k: cfg[k] for k in changed if k in cfg}, info.get("config", {}))
    if dropped:
        raise server_features.unknown_fields_error(conn, name, dropped)
    return {"action": "updated", "changed": changed, "info": info}


async def purge_stream(conn: JetStreamConnection, name: str, *, subject: str | None = None) -> int:
    """Purge a stream (optionally one subject); returns how many messages were removed."""
    validate_name(name, what="stream name")
    body = {"filter": validate_subject(subject, allow_wildcards=True)} if subject else None
    reply = await conn.api_request(f"STREAM.PURGE.{name}", body, context=f"purge stream {name!r}")
    return int(reply.get("purged", 0))


async def first_seq_at_or_after(conn: JetStreamConnection, stream: str, when: datetime | str) -> int:
    """The sequence of the first message stored at or after ``when``; last_seq + 1 if none is."""
    validate_name(stream, what="stream name")
    body = {"start_time": to_rfc3339(when)}
    try:
        reply = await conn.api_request(f"STREAM.MSG.GET.{stream}", body, context=f"stream {stream!r}")
    except ServerAPIError as exc:
        if exc.err_code != 10037:
            raise
        return int((await stream_info(conn, stream))["state"]["last_seq"]) + 1
    return int(reply["message"]["seq"])


async def streams_for_subject(conn: JetStreamConnection, subject: str, *,
                              deadline: Deadline | None = None) -> list[str]:
    """The stream that captures ``subject`` as a list (empty when none; streams cannot overlap).

    nats-py's ``find_stream_name_by_subject``, with the toolkit's errors: the server's API errors typed,
    no responder as :class:`JetStreamNotEnabledError`, no reply as a permission error or a leader election
    (retried for ``leader_wait`` on a cluster, or until ``deadline``).
    """
    import nats.errors  # imports nats-py: DAG files import this module
    import nats.js.errors

    context = f"streams for {subject!r}"

    async def once() -> list[str]:
        try:
            return [await conn.js.find_stream_name_by_subject(subject)]
        except nats.js.errors.NotFoundError:
            return []
        except nats.js.errors.ServiceUnavailableError as exc:
            if exc.code is None and exc.err_code is None:  # nats-py's stand-in for "no responders"
                raise JetStreamNotEnabledError(f"{context}: no responder: JetStream is not enabled for this "
                                               "account, or the domain / API prefix is wrong") from None
            raise error_from_api(vars(exc), context=context) from None
        except nats.js.errors.APIError as exc:
            raise error_from_api(vars(exc), context=context) from None
        except nats.errors.TimeoutError:
            denied = conn.permission_error(f"{conn.api_prefix}.STREAM.NAMES")
            raise denied or conn.unanswered(f"{context}: no reply within {conn.settings.request_timeout:g}s") from None

    return await conn.retry_leader(context, once, deadline=deadline, logger=log)


def domain_api_prefix(domain: str) -> str:
    """``$JS.<domain>.API``: the API prefix of a JetStream domain."""
    validate_name(domain, what="JetStream domain")
    return f"$JS.{domain}.API"


def api_view(conn: JetStreamConnection, *, domain: str | None = None,
             api_prefix: str | None = None) -> JetStreamConnection:
    """``conn`` itself, or the same connection with its API requests sent to ``domain`` / ``api_prefix``
    (:meth:`~airflow_jetstream.client.connection.JetStreamConnection.with_api_prefix`)."""
    if domain and api_prefix:
        raise InvalidRequestError("give either a JetStream domain or an API prefix, not both")
    prefix = domain_api_prefix(domain) if domain else api_prefix
    if not prefix or prefix == conn.api_prefix:
        return conn
    validate_subject(prefix, what="JetStream API prefix")
    return conn.with_api_prefix(prefix)


# Which requested fields of a stream or consumer config differ from what the server has: shared by the idempotent
# create-or-update of both, so they read "unchanged" the same way. The server leaves zero values out of its JSON
# (Go ``omitempty``) and adds fields nobody asked for, hence: a falsy requested value matches an absent or falsy
# one; a dict matches when every requested key does; a list of scalars (subjects) matches as a multiset (order is
# not config); a list of dicts (sources) element by element; a field the server omitted compares with its default.


def config_value_matches(wanted: Any, current: Any) -> bool:
    """True when the server's ``current`` value already is the requested ``wanted`` value."""
    if _is_empty(wanted):
        return _is_empty(current)
    if isinstance(wanted, dict):
        return isinstance(current, dict) and all(config_value_matches(v, current.get(k)) for k, v in wanted.items())
    if isinstance(wanted, list):
        if not isinstance(current, list) or len(wanted) != len(current):
            return False
        if all(not isinstance(x, (dict, list)) for x in wanted):
            return sorted(map(str, wanted)) == sorted(map(str, current))
        return all(config_value_matches(w, c) for w, c in zip(wanted, current, strict=True))
    return bool(wanted == current)


def changed_fields(wanted: Mapping[str, Any], current: Mapping[str, Any], *,
                   defaults: Mapping[str, Any] | None = None,
                   same: Mapping[str, Callable[[Any, Any], bool]] | None = None) -> list[str]:
    """Sorted names of the requested fields whose value differs from the current config.

    ``same`` gives a field its own comparison (for example timestamps written in different forms);
    it is called only when the server has a value for the field.
    """
    defaults = defaults or {}
    same = same or {}
    changed = []
    for key, value in wanted.items():
        have = current.get(key, defaults.get(key))
        compare = same.get(key) if not _is_empty(have) else None
        if not (compare or config_value_matches)(value, have):
            changed.append(key)
    return sorted(changed)


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, (dict, list, str, int, float)) and not value)
