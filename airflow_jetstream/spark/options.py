"""Typed parsing of the ``jetstream`` data source options.

Spark hands options over as strings with lower-cased keys. Every option is looked up by its
lower-case name, unknown options are refused (a typo must not be silently ignored) and values are
converted and checked here, on the driver, before any task starts or anything is sent.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_jetstream.client.admin.streams import check_replicas, normalize_placement
from airflow_jetstream.client.batches.fast import DEFAULT_FLOW
from airflow_jetstream.client.batches.fence import FENCED_MAX_MSGS
from airflow_jetstream.client.batches.types import DEFAULT_MAX_BATCH_MSGS
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import InvalidRequestError, InvalidSettingsError
from airflow_jetstream.client.kv.job_records import DEFAULT_JOB_BUCKET
from airflow_jetstream.client.ledger.records import DEFAULT_BUCKET
from airflow_jetstream.client.settings import SETTINGS_FIELDS, ConnectionSettings, parse_bool, settings_from_fields
from airflow_jetstream.client.subjects import validate_name, validate_subject
from airflow_jetstream.client.times import parse_time
from airflow_jetstream.spark.json_rows import DEFAULT_CORRUPT_RECORD_COLUMN, JSON_MODES

#: Connection fields that may be given as options (``servers`` is a comma-separated list).
CONNECTION_OPTIONS = SETTINGS_FIELDS
_JOB_ID = re.compile(r"[A-Za-z0-9_\-]{1,40}")

WRITE_MODES = ("atomic", "fast")
#: Rows per chunk: the server's atomic batch limit; fast batches are unlimited and ramp their flow
#: up per batch (from 1 while other fast batches are open), so they get longer chunks.
BATCH_SIZE_DEFAULTS = {"atomic": DEFAULT_MAX_BATCH_MSGS, "fast": 10_000}
#: Chunks in flight per task: atomic batches wait for their commit, so several overlap; concurrent
#: fast batches slow each other's flow control down.
INFLIGHT_DEFAULTS = {"atomic": 4, "fast": 1}
DECODINGS = ("none", "utf-8", "json")


def _bad(option: str, value: str, expected: str) -> InvalidRequestError:
    return InvalidRequestError(f"option {option}={value!r} is invalid: {expected}", reason="invalid_option")


def _check_known(options: Mapping[str, str], allowed: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise InvalidRequestError(
            f"unknown {what} option(s) {', '.join(unknown)}; the jetstream data source knows "
            f"{', '.join(sorted(allowed))}",
            reason="unknown_option",
        )


def _int(options: Mapping[str, str], key: str, default: int | None, *, minimum: int = 1,
         maximum: int | None = None) -> int | None:
    raw = options.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _bad(key, raw, "expected an integer") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise _bad(key, raw, f"expected an integer {bound}")
    return value


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None or raw == "":
        return default
    try:
        return parse_bool(key, raw)
    except InvalidSettingsError:
        raise _bad(key, raw, "expected true or false") from None


def _choice(options: Mapping[str, str], key: str, choices: tuple[str, ...], default: str) -> str:
    raw = (options.get(key) or default).strip().lower()
    if raw == "utf8":
        raw = "utf-8"
    if raw not in choices:
        raise _bad(key, raw, f"use one of {', '.join(choices)}")
    return raw


def _subjects(options: Mapping[str, str], key: str) -> tuple[str, ...]:
    raw = options.get(key) or ""
    return tuple(validate_subject(s.strip(), allow_wildcards=True, what=f"option {key}")
                 for s in raw.split(",") if s.strip())


def _subject_groups(options: Mapping[str, str]) -> tuple[tuple[str, ...], ...]:
    """``worker_subjects`` = ``"orders.eu.*,orders.uk.*;orders.us.*"``: one group of subjects per worker."""
    raw = options.get("worker_subjects") or ""
    groups = []
    for part in raw.split(";"):
        group = tuple(validate_subject(s.strip(), allow_wildcards=True, what="option worker_subjects")
                      for s in part.split(",") if s.strip())
        if group:
            groups.append(group)
    return tuple(groups)


def _stream(options: Mapping[str, str]) -> str:
    stream = options.get("stream") or options.get("path")
    if not stream:
        raise InvalidRequestError(
            "the jetstream data source needs the stream: .option('stream', 'ORDERS') (or .load('ORDERS'))",
            reason="missing_option",
        )
    return validate_name(stream, what="option stream")


def connection_settings(options: Mapping[str, str]) -> ConnectionSettings:
    """ConnectionSettings from the connection options (``servers``, ``user``, ``password``, ...)."""
    if not options.get("servers"):
        raise InvalidRequestError(
            "the jetstream data source needs the NATS servers: submit the job with "
            "JetStreamSparkSubmitOperator(nats_conn_id=...) and call register(spark), or set "
            ".option('servers', 'nats://host:4222')",
            reason="missing_option",
        )
    return settings_from_fields({k: options[k] for k in CONNECTION_OPTIONS if k in options},
                                what="data source option")


def lowered(options: Mapping[str, str]) -> dict[str, str]:
    """The options with lower-case keys (Spark already lower-cases them; plain dicts may not)."""
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


@dataclass(frozen=True)
class WriteOptions:
    """Parsed options of ``df.write.format("jetstream")``."""

    settings: ConnectionSettings
    stream: str
    mode: str
    job_id: str
    job_id_given: bool
    subject: str | None
    subject_column: str
    payload_column: str
    headers_column: str
    batch_size: int
    flow: int
    ledger_bucket: str | None
    run_id: str
    job_bucket: str
    inflight: int
    #: replicas/placement of the ledger and job buckets when the write creates them (None: the default)
    ledger_replicas: int | None = None
    ledger_placement: dict[str, Any] | None = None
    #: how long the ledger keeps a key after its last change (seconds; None: a new bucket's default, 30 days)
    ledger_ttl: float | None = None
    #: atomic chunks are fenced (exactly once at any time); False: msg ids only, bounded by the duplicate window
    fence: bool = True

    KEYS = ("stream", "path", "mode", "job_id", "subject", "subject_column", "payload_column",
            "headers_column", "batch_size", "flow", "ledger_bucket", "run_id", "job_bucket", "inflight",
            "ledger_replicas", "ledger_placement_cluster", "ledger_placement_tags", "ledger_ttl", "fence")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        opts = lowered(options)
        _check_known(opts, cls.KEYS + CONNECTION_OPTIONS, "write")
        job_id = opts.get("job_id") or ""
        if job_id and not _JOB_ID.fullmatch(job_id):
            raise _bad("job_id", job_id, "1-40 letters, digits, '-' or '_' (it is part of message and batch ids)")
        subject = opts.get("subject") or None
        if subject:
            validate_subject(subject, what="option subject")
        given_bucket = opts.get("ledger_bucket") or DEFAULT_BUCKET
        ledger_bucket = None if given_bucket.lower() == "none" else validate_name(given_bucket,
                                                                                   what="option ledger_bucket")
        job_bucket = validate_name(opts.get("job_bucket") or DEFAULT_JOB_BUCKET, what="option job_bucket")
        job_id = job_id or uuid.uuid4().hex[:32]
        mode = _choice(opts, "mode", WRITE_MODES, "atomic")
        fence = _bool(opts, "fence", True)
        return cls(
            settings=connection_settings(opts),
            stream=_stream(opts),
            mode=mode,
            job_id=job_id,
            job_id_given=bool(opts.get("job_id")),
            subject=subject,
            subject_column=opts.get("subject_column") or "subject",
            payload_column=opts.get("payload_column") or "payload",
            headers_column=opts.get("headers_column") or "headers",
            # a fenced atomic chunk and its fence fill the server's default max_msgs (1000)
            batch_size=_int(opts, "batch_size", None, maximum=100_000) or (
                FENCED_MAX_MSGS if mode == "atomic" and fence else BATCH_SIZE_DEFAULTS[mode]),
            flow=_int(opts, "flow", DEFAULT_FLOW, maximum=10_000) or DEFAULT_FLOW,
            ledger_bucket=ledger_bucket,
            run_id=opts.get("run_id") or job_id,
            job_bucket=job_bucket,
            inflight=_int(opts, "inflight", None, maximum=32) or INFLIGHT_DEFAULTS[mode],
            ledger_replicas=check_replicas(opts.get("ledger_replicas"), what="option ledger_replicas"),
            ledger_placement=normalize_placement({"cluster": opts.get("ledger_placement_cluster") or None,
                                                  "tags": opts.get("ledger_placement_tags") or None}),
            ledger_ttl=to_seconds(opts["ledger_ttl"], field="option ledger_ttl") if opts.get("ledger_ttl") else None,
            fence=fence,
        )


@dataclass(frozen=True)
class ReadOptions:
    """Parsed options of ``spark.read.format("jetstream")``."""

    settings: ConnectionSettings
    stream: str
    filter_subjects: tuple[str, ...]
    start_seq: int | None
    start_time: str | None
    end_seq: int | None
    num_partitions: int | None
    decode: str
    consume: bool
    batch_size: int
    consumer: str | None
    worker_subjects: tuple[tuple[str, ...], ...] = ()
    worker_prefix: str = "spark-reader"
    json_mode: str = "failfast"
    corrupt_record_column: str = DEFAULT_CORRUPT_RECORD_COLUMN

    KEYS = ("stream", "path", "filter_subjects", "start_seq", "start_time", "end_seq", "num_partitions", "decode",
            "consume", "batch_size", "consumer", "worker_subjects", "worker_prefix", "json_mode",
            "corrupt_record_column")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = lowered(options)
        _check_known(opts, cls.KEYS + CONNECTION_OPTIONS, "read")
        start_seq = _int(opts, "start_seq", None)
        start_time = opts.get("start_time") or None
        if start_time:
            parse_time(start_time, field="option start_time")
        groups = _subject_groups(opts)
        if groups and (opts.get("filter_subjects") or opts.get("num_partitions") or opts.get("consumer")):
            raise InvalidRequestError(
                "worker_subjects sets the partitions (one per group), their filters and cursors; "
                "leave filter_subjects, num_partitions and consumer unset",
                reason="invalid_option",
            )
        if start_seq is not None and start_time:
            raise InvalidRequestError("give either start_seq or start_time, not both", reason="invalid_option")
        return cls(
            settings=connection_settings(opts),
            stream=_stream(opts),
            filter_subjects=_subjects(opts, "filter_subjects"),
            start_seq=start_seq,
            start_time=start_time,
            end_seq=_int(opts, "end_seq", None, minimum=0),
            num_partitions=_int(opts, "num_partitions", None, maximum=1024),
            decode=_choice(opts, "decode", DECODINGS, "none"),
            consume=_bool(opts, "consume", False),
            batch_size=_int(opts, "batch_size", 5000, maximum=100_000) or 5000,
            consumer=validate_name(opts["consumer"], what="option consumer") if opts.get("consumer") else None,
            worker_subjects=groups,
            worker_prefix=validate_name(opts.get("worker_prefix") or "spark-reader", what="option worker_prefix"),
            json_mode=_choice(opts, "json_mode", JSON_MODES, "failfast"),
            corrupt_record_column=opts.get("corrupt_record_column") or DEFAULT_CORRUPT_RECORD_COLUMN,
        )


@dataclass(frozen=True)
class StreamReadOptions:
    """Parsed options of ``spark.readStream.format("jetstream")``: the batch read's options (``read``)
    plus where a new query starts and how much one micro-batch may take.

    ``start`` is ``"first"`` (the stream's first message, the default, as for the batch read),
    ``"new"`` (messages stored after the query started), a stream sequence or a time; the batch
    read's ``start_seq``/``start_time`` are accepted too (one of the three at most).
    """

    read: ReadOptions
    start: str = "first"
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    #: A stop position: the query never reads messages stored at or after this time (``read.end_seq``:
    #: after this sequence), so a scheduled run with Trigger.AvailableNow covers a fixed interval.
    end_time: str | None = None

    KEYS = ("start", "max_messages_per_trigger", "max_bytes_per_trigger", "end_time")
    #: Batch read options that have no meaning for an unbounded read.
    BATCH_ONLY = ("worker_subjects", "worker_prefix")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamReadOptions:
        opts = lowered(options)
        _check_known(opts, ReadOptions.KEYS + cls.KEYS + CONNECTION_OPTIONS, "streaming read")
        batch_only = sorted(k for k in cls.BATCH_ONLY if opts.get(k))
        if batch_only:
            raise InvalidRequestError(
                f"option(s) {', '.join(batch_only)} belong to the batch read (spark.read); a streaming read "
                "runs until stopped (use Trigger.AvailableNow to stop at the end of what is stored)",
                reason="invalid_option",
            )
        start = (opts.pop("start", "") or "").strip()
        if start.lower() in ("first", "new"):
            start = start.lower()
        given = [k for k in ("start_seq", "start_time") if opts.get(k)] + (["start"] if start else [])
        if len(given) > 1:
            raise InvalidRequestError(f"give one start position, not {' and '.join(given)}", reason="invalid_option")
        if start and start not in ("first", "new") and not start.isdigit():
            parse_time(start, field="option start")
        if start.isdigit() and int(start) < 1:
            raise _bad("start", start, "a stream sequence is >= 1")
        max_messages = _int(opts, "max_messages_per_trigger", None)
        max_bytes = _int(opts, "max_bytes_per_trigger", None)
        end_time = opts.get("end_time") or None
        if end_time:
            parse_time(end_time, field="option end_time")
            if opts.get("end_seq"):
                raise InvalidRequestError("give either end_seq or end_time, not both", reason="invalid_option")
        for key in cls.KEYS:
            opts.pop(key, None)
        return cls(read=ReadOptions.parse(opts), start=start or "first", max_messages_per_trigger=max_messages,
                   max_bytes_per_trigger=max_bytes, end_time=end_time)


#: Options Spark itself hands to a source or sink: ``save(path)``/``load(path)`` and a streaming query's checkpoint.
SPARK_GIVEN_OPTIONS = ("path", "checkpointlocation")


def check_option_names(options: Mapping[str, str]) -> None:
    """Refuse option names that no read, streaming read or write knows, as soon as Spark builds the
    data source (at ``load()``/``save()``/``start()``, not at the first action)."""
    known = (*WriteOptions.KEYS, *ReadOptions.KEYS, *StreamReadOptions.KEYS, *CONNECTION_OPTIONS,
             *SPARK_GIVEN_OPTIONS)
    _check_known(lowered(options), tuple(dict.fromkeys(known)), "jetstream")
