"""Typed parsing of the ``jetstream`` data source options, from one table of option parsers.

Spark hands options over as strings with lower-cased keys. Every option is looked up by its
lower-case name, unknown options are refused (a typo must not be silently ignored) and values are
converted and checked here, on the driver, before any task starts or anything is sent.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_jetstream.client.admin.streams import check_replicas, normalize_placement
from airflow_jetstream.client.batches.fast import DEFAULT_FLOW
from airflow_jetstream.client.batches.types import DEFAULT_MAX_BATCH_MSGS, FENCED_MAX_MSGS
from airflow_jetstream.client.durations import parse_time, to_seconds
from airflow_jetstream.client.errors import InvalidRequestError, InvalidSettingsError
from airflow_jetstream.client.kv.job_records import DEFAULT_JOB_BUCKET
from airflow_jetstream.client.ledger.records import DEFAULT_BUCKET
from airflow_jetstream.client.settings import SETTINGS_FIELDS, ConnectionSettings, parse_bool, settings_from_fields
from airflow_jetstream.client.subjects import validate_name, validate_subject
from airflow_jetstream.spark.json_rows import DEFAULT_CORRUPT_RECORD_COLUMN, JSON_MODES

_JOB_ID = re.compile(r"[A-Za-z0-9_\-]{1,40}")

WRITE_MODES = ("atomic", "fast")
#: Rows per chunk: the server's atomic batch limit; fast batches are unlimited and ramp their flow
#: up per batch (from 1 while other fast batches are open), so they get longer chunks.
BATCH_SIZE_DEFAULTS = {"atomic": DEFAULT_MAX_BATCH_MSGS, "fast": 10_000}
#: Chunks in flight per task: atomic batches wait for their commit, so several overlap; concurrent
#: fast batches slow each other's flow control down.
INFLIGHT_DEFAULTS = {"atomic": 4, "fast": 1}
DECODINGS = ("none", "utf-8", "json")
#: An option's parser: (its name, its non-empty string) -> its value, or a typed error naming the option.
Parser = Callable[[str, str], Any]


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


def _int(minimum: int = 1, maximum: int | None = None) -> Parser:
    def parse(key: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise _bad(key, raw, "expected an integer") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            raise _bad(key, raw, f"expected an integer {bound}")
        return value

    return parse


def _bool(key: str, raw: str) -> bool:
    try:
        return parse_bool(key, raw)
    except InvalidSettingsError:
        raise _bad(key, raw, "expected true or false") from None


def _choice(*choices: str) -> Parser:
    def parse(key: str, raw: str) -> str:
        value = raw.strip().lower()
        value = "utf-8" if value == "utf8" else value
        if value not in choices:
            raise _bad(key, value, f"use one of {', '.join(choices)}")
        return value

    return parse


def _text(key: str, raw: str) -> str:
    return raw


def _name(key: str, raw: str) -> str:
    return validate_name(raw, what=f"option {key}")


def _time(key: str, raw: str) -> str:
    parse_time(raw, field=f"option {key}")
    return raw


def _subjects(key: str, raw: str) -> tuple[str, ...]:
    return tuple(validate_subject(s.strip(), allow_wildcards=True, what=f"option {key}")
                 for s in raw.split(",") if s.strip())


def _subject_groups(key: str, raw: str) -> tuple[tuple[str, ...], ...]:
    """``worker_subjects`` = ``"orders.eu.*,orders.uk.*;orders.us.*"``: one group of subjects per worker."""
    return tuple(group for group in (_subjects(key, part) for part in raw.split(";")) if group)


def _job_id(key: str, raw: str) -> str:
    if not _JOB_ID.fullmatch(raw):
        raise _bad(key, raw, "1-40 letters, digits, '-' or '_' (it is part of message and batch ids)")
    return raw


def _start(key: str, raw: str) -> str:
    """A streaming read's start: ``first``, ``new``, a stream sequence (>= 1) or a time."""
    start = raw.strip()
    if start.lower() in ("first", "new"):
        return start.lower()
    if start.isdigit() and int(start) < 1:
        raise _bad(key, start, "a stream sequence is >= 1")
    return start if start.isdigit() or not start else _time(key, start)


#: Every option's parser; which options a read, a streaming read or a write takes are the classes' ``KEYS``.
PARSERS: dict[str, Parser] = {
    "stream": _text, "path": _text, "batch_size": _int(maximum=100_000),
    # writes
    "mode": _choice(*WRITE_MODES), "job_id": _job_id,
    "subject": lambda key, raw: validate_subject(raw, what=f"option {key}"),
    "subject_column": _text, "payload_column": _text, "headers_column": _text, "flow": _int(maximum=10_000),
    "ledger_bucket": lambda key, raw: None if raw.lower() == "none" else _name(key, raw), "run_id": _text,
    "job_bucket": _name, "inflight": _int(maximum=32),
    "ledger_replicas": lambda key, raw: check_replicas(raw, what=f"option {key}"),
    "ledger_placement_cluster": _text, "ledger_placement_tags": _text,
    "ledger_ttl": lambda key, raw: to_seconds(raw, field=f"option {key}"), "fence": _bool,
    # reads
    "filter_subjects": _subjects, "start_seq": _int(), "start_time": _time, "end_seq": _int(minimum=0),
    "num_partitions": _int(maximum=1024), "decode": _choice(*DECODINGS), "consume": _bool, "consumer": _name,
    "worker_subjects": _subject_groups, "worker_prefix": _name, "json_mode": _choice(*JSON_MODES),
    "corrupt_record_column": _text,
    # streaming reads
    "start": _start, "max_messages_per_trigger": _int(), "max_bytes_per_trigger": _int(), "end_time": _time,
}


def _parsed(options: Mapping[str, str], keys: tuple[str, ...], what: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The options with lower-case keys and the parsed values of those given (an empty string is not given)."""
    opts = lowered(options)
    _check_known(opts, keys + SETTINGS_FIELDS, what)
    return opts, {key: PARSERS[key](key, raw) for key, raw in opts.items() if key in keys and raw != ""}


def _stream(values: Mapping[str, Any]) -> str:
    stream = values.get("stream") or values.get("path")
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
    return settings_from_fields({k: options[k] for k in SETTINGS_FIELDS if k in options},
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
    batch_size: int
    run_id: str
    inflight: int
    subject: str | None = None
    subject_column: str = "subject"
    payload_column: str = "payload"
    headers_column: str = "headers"
    flow: int = DEFAULT_FLOW
    ledger_bucket: str | None = DEFAULT_BUCKET
    job_bucket: str = DEFAULT_JOB_BUCKET
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
        opts, v = _parsed(options, cls.KEYS, "write")
        job_id = v.get("job_id") or uuid.uuid4().hex[:32]
        mode, fence = v.get("mode", "atomic"), v.get("fence", True)
        # a fenced atomic chunk and its fence fill the server's default max_msgs (1000)
        batch_size = FENCED_MAX_MSGS if mode == "atomic" and fence else BATCH_SIZE_DEFAULTS[mode]
        given = {k: v[k] for k in ("subject", "subject_column", "payload_column", "headers_column", "flow",
                                   "ledger_bucket", "job_bucket", "ledger_replicas", "ledger_ttl") if k in v}
        placement = {"cluster": v.get("ledger_placement_cluster"), "tags": v.get("ledger_placement_tags")}
        return cls(settings=connection_settings(opts), stream=_stream(v), mode=mode, job_id=job_id,
                   job_id_given="job_id" in v, batch_size=v.get("batch_size", batch_size),
                   run_id=v.get("run_id", job_id),
                   inflight=v.get("inflight", INFLIGHT_DEFAULTS[mode]), fence=fence,
                   ledger_placement=normalize_placement(placement), **given)


@dataclass(frozen=True)
class ReadOptions:
    """Parsed options of ``spark.read.format("jetstream")`` and, parsed with ``streaming``, of
    ``spark.readStream.format("jetstream")``: the batch read's plus where a new query starts and how much one
    micro-batch may take.

    ``start`` is ``"first"`` (the stream's first message, the default, as for the batch read),
    ``"new"`` (messages stored after the query started), a stream sequence or a time; the batch
    read's ``start_seq``/``start_time`` are accepted too (one of the three at most).
    """

    settings: ConnectionSettings
    stream: str
    filter_subjects: tuple[str, ...] = ()
    start_seq: int | None = None
    start_time: str | None = None
    end_seq: int | None = None
    num_partitions: int | None = None
    decode: str = "none"
    consume: bool = False
    batch_size: int = 5000
    consumer: str | None = None
    worker_subjects: tuple[tuple[str, ...], ...] = ()
    worker_prefix: str = "spark-reader"
    json_mode: str = "failfast"
    corrupt_record_column: str = DEFAULT_CORRUPT_RECORD_COLUMN
    start: str = "first"
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    #: A stop position: the query never reads messages stored at or after this time (``end_seq``:
    #: after this sequence), so a scheduled run with Trigger.AvailableNow covers a fixed interval.
    end_time: str | None = None

    KEYS = ("stream", "path", "filter_subjects", "start_seq", "start_time", "end_seq", "num_partitions", "decode",
            "consume", "batch_size", "consumer", "worker_subjects", "worker_prefix", "json_mode",
            "corrupt_record_column")
    #: The options only a streaming read takes.
    STREAM_KEYS = ("start", "max_messages_per_trigger", "max_bytes_per_trigger", "end_time")
    #: Batch read options that have no meaning for an unbounded read.
    BATCH_ONLY = ("worker_subjects", "worker_prefix")

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
        keys = cls.KEYS + cls.STREAM_KEYS if streaming else cls.KEYS
        opts, v = _parsed(options, keys, "streaming read" if streaming else "read")
        batch_only = sorted(k for k in cls.BATCH_ONLY if opts.get(k))
        if streaming and batch_only:
            raise InvalidRequestError(
                f"option(s) {', '.join(batch_only)} belong to the batch read (spark.read); a streaming read "
                "runs until stopped (use Trigger.AvailableNow to stop at the end of what is stored)",
                reason="invalid_option",
            )
        given = [k for k in ("start_seq", "start_time", "start") if v.get(k)]
        if streaming and len(given) > 1:
            raise InvalidRequestError(f"give one start position, not {' and '.join(given)}", reason="invalid_option")
        if "end_time" in v and "end_seq" in v:
            raise InvalidRequestError("give either end_seq or end_time, not both", reason="invalid_option")
        if v.get("worker_subjects") and any(k in v for k in ("filter_subjects", "num_partitions", "consumer")):
            raise InvalidRequestError(
                "worker_subjects sets the partitions (one per group), their filters and cursors; "
                "leave filter_subjects, num_partitions and consumer unset",
                reason="invalid_option",
            )
        if "start_seq" in v and "start_time" in v:
            raise InvalidRequestError("give either start_seq or start_time, not both", reason="invalid_option")
        # every other option has the name of its field (whose default applies when it is not given)
        return cls(settings=connection_settings(opts), stream=_stream(v),
                   **{k: v[k] for k in keys[2:] if k in v and v[k] != ""})


#: Options Spark itself hands to a source or sink: ``save(path)``/``load(path)`` and a streaming query's checkpoint.
SPARK_GIVEN_OPTIONS = ("path", "checkpointlocation")


def check_option_names(options: Mapping[str, str]) -> None:
    """Refuse option names that no read, streaming read or write knows, as soon as Spark builds the
    data source (at ``load()``/``save()``/``start()``, not at the first action)."""
    known = (*WriteOptions.KEYS, *ReadOptions.KEYS, *ReadOptions.STREAM_KEYS, *SETTINGS_FIELDS,
             *SPARK_GIVEN_OPTIONS)
    _check_known(lowered(options), tuple(dict.fromkeys(known)), "jetstream")
