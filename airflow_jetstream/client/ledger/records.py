"""What the ledger stores, without I/O: batch states, the KV keys of a batch and of a run's counts,
:class:`BatchRecord` (the JSON value, docs/contracts.md), its JSON Schema, and a batch's state transitions.

Values are checked on read and on write by a small interpreter of the schema's own keywords (``type``,
``required``, ``enum``, ``minimum``, ``minLength``), so Spark executors and triggerers need no ``jsonschema``; a
test validates the same records with ``jsonschema`` against the published file. One difference: an integer written
as ``3.0`` is refused here (JSON Schema accepts it).

The transitions are pure functions from the current record to the new one (None: leave it): they read no clock
and write nothing; the group commit applies each with a revision-checked write, deciding again on a race.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, cast

from airflow_jetstream.client import metrics
from airflow_jetstream.client.errors import (
    ClaimLostError,
    InvalidRequestError,
    LedgerConflictError,
    LedgerRecordError,
)

log = logging.getLogger(__name__)

#: The KV bucket of the ledger unless told otherwise.
DEFAULT_BUCKET = "batch_ledger"
PUBLISHED, IN_PROGRESS, CONSUMED, FAILED = "published", "in_progress", "consumed", "failed"
STATES = (PUBLISHED, IN_PROGRESS, CONSUMED, FAILED)
#: States a run can be awaited in; a batch "reached" a state when it is there or further along.
WAITABLE_STATES = (PUBLISHED, IN_PROGRESS, CONSUMED)
#: How far along each waitable state is.
RANK = {PUBLISHED: 0, IN_PROGRESS: 1, CONSUMED: 2}
#: Characters a KV key token keeps as they are; every other character is escaped as ``=HH`` per UTF-8 byte.
KEY_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
MAX_ID_LENGTH = 256
#: Subsets a run's counts are split into (part of the ledger contract: every writer uses the same split).
SHARDS = 16
#: The key token between a run and its counts shard number.
COUNTS_TOKEN = "/counts"

_TEXT = {"type": "string", "minLength": 1}
_TIME = {"type": "string", "format": "date-time"}
_OPTIONAL_TIME = {"type": ["string", "null"], "format": "date-time"}
_OPTIONAL_TEXT = {"type": ["string", "null"]}
_SEQ = {"type": ["integer", "null"], "minimum": 1}

#: JSON Schema (2020-12) of one ledger value. Fields other services add are allowed and kept.
LEDGER_RECORD_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://airflow-jetstream.dev/schemas/ledger-record.schema.json",
    "title": "airflow-jetstream batch ledger record",
    "description": "The JSON value of one batch in the batch ledger KV bucket (key <run>.<batch>, escaped). "
                   "Writers must keep fields they do not know; times are RFC 3339.",
    "type": "object",
    "required": ["run_id", "batch_id", "stream", "count", "state"],
    "properties": {
        "run_id": _TEXT,
        "batch_id": _TEXT,
        "stream": _TEXT,
        "count": {"type": "integer", "minimum": 0},
        "first_seq": _SEQ,
        "last_seq": _SEQ,
        "state": {"enum": list(STATES)},
        "attempts": {"type": "integer", "minimum": 0},
        "max_attempts": {"type": ["integer", "null"], "minimum": 1},
        "owner": _OPTIONAL_TEXT,
        "claim_id": _OPTIONAL_TEXT,
        "claimed_at": _OPTIONAL_TIME,
        "deadline": _OPTIONAL_TIME,
        "created_at": _TIME,
        "updated_at": _TIME,
        "consumed_at": _OPTIONAL_TIME,
        "failed_at": _OPTIONAL_TIME,
        "last_error": _OPTIONAL_TEXT,
        "meta": {"type": "object"},
    },
    "additionalProperties": True,
}

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "object": (dict,), "array": (list,),
    "boolean": (bool,), "null": (type(None),),
}


def _type_ok(value: Any, names: str | list[str]) -> bool:
    for name in [names] if isinstance(names, str) else names:
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, _JSON_TYPES[name]):
            return True
    return False


def schema_problem(schema: dict[str, Any], body: Any) -> str | None:
    """What makes ``body`` not match ``schema`` (naming the field), or None when it does."""
    if not isinstance(body, dict):
        return f"the value is a JSON {type(body).__name__}, not an object"
    for name in schema["required"]:
        if name not in body:
            return f"field {name!r} is missing"
    for name, rule in schema["properties"].items():
        if name not in body:
            continue
        value = body[name]
        if "type" in rule and not _type_ok(value, rule["type"]):
            return f"field {name!r} is {value!r}, not of type {rule['type']}"
        if "enum" in rule and value not in rule["enum"]:
            return f"field {name!r} is {value!r}, not one of {', '.join(rule['enum'])}"
        if "minimum" in rule and value is not None and value < rule["minimum"]:
            return f"field {name!r} is {value!r}, below {rule['minimum']}"
        if "minLength" in rule and len(value) < rule["minLength"]:
            return f"field {name!r} is empty"
    return None


def checked(schema: dict[str, Any], body: Any, *, key: str, when: str) -> dict[str, Any]:
    """``body`` when it matches ``schema`` (a record's or a counts value's), else :class:`LedgerRecordError` naming
    the key and the field."""
    problem = schema_problem(schema, body)
    if problem:
        repair = "" if schema is LEDGER_RECORD_SCHEMA else \
            "; BatchLedger.recount(run_id, repair=True) rewrites a run's counts from its records"
        raise LedgerRecordError(
            f"ledger key {key!r}: {problem} ({when}); see docs/schemas/{schema['$id'].rsplit('/', 1)[1]} for the "
            f"value schema, and fix the service that wrote it{repair}",
        )
    return cast(dict[str, Any], body)  # schema_problem checked it is an object


def loaded(schema: dict[str, Any], data: bytes, *, key: str, seq: int) -> dict[str, Any]:
    """A stored value read at revision ``seq``, checked against ``schema``; one that is not JSON at all is
    :class:`LedgerConflictError` (``ledger_corrupt``)."""
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise LedgerConflictError(
            f"ledger key {key!r} (revision {seq}) is not a ledger value ({type(exc).__name__}); the bucket is used "
            "by something else: give the ledger its own bucket",
            reason="ledger_corrupt",
        ) from None
    return checked(schema, body, key=key, when=f"read at revision {seq}")


def dumped(schema: dict[str, Any], body: dict[str, Any], *, key: str) -> bytes:
    """The stored JSON of ``body``, checked against ``schema`` before it is written."""
    return json.dumps(checked(schema, body, key=key, when="refused to write it"), separators=(",", ":")).encode()


@dataclass(frozen=True)
class Entry:
    """The last value of a ledger key: ``seq`` is its revision; ``deleted`` for a delete or purge marker."""

    key: str
    seq: int
    data: bytes
    deleted: bool


def key_token(value: str) -> str:
    """A KV key token for any id: safe characters kept, others as ``=HH`` per UTF-8 byte (reversible)."""
    return "".join(ch if ch in KEY_SAFE else "".join(f"={b:02X}" for b in ch.encode()) for ch in value)


def check_id(value: object, what: str) -> str:
    """A run or batch id: a non-empty string of at most ``MAX_ID_LENGTH`` characters."""
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{what} must be a non-empty string, got {value!r}", reason="invalid_id")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidRequestError(f"{what} is longer than {MAX_ID_LENGTH} characters", reason="invalid_id")
    return value


def batch_key(run_id: str, batch_id: str) -> str:
    """The KV key of a batch: ``<run>.<batch>``, each token escaped to the KV key alphabet."""
    return f"{key_token(check_id(run_id, 'run_id'))}.{key_token(check_id(batch_id, 'batch_id'))}"


def shard_of(batch_id: str) -> int:
    """The counts shard of a batch: ``crc32(batch_id as UTF-8) % 16`` (CRC-32 as zlib computes it)."""
    return zlib.crc32(check_id(batch_id, "batch_id").encode()) % SHARDS


def counts_key(run_id: str, shard: int) -> str:
    """The KV key of a run's counts shard: ``<escaped run>./counts.<shard>``."""
    return f"{key_token(check_id(run_id, 'run_id'))}.{COUNTS_TOKEN}.{shard}"


def counts_pattern(run_id: str) -> str:
    """The KV key filter of all counts shards of a run."""
    return f"{key_token(check_id(run_id, 'run_id'))}.{COUNTS_TOKEN}.*"


def is_counts_key(key: str) -> bool:
    """Whether a ledger key is a counts shard (``<run>./counts.<n>``) rather than a batch record."""
    parts = key.split(".")
    return len(parts) == 3 and parts[1] == COUNTS_TOKEN


def iso_time(epoch: float) -> str:
    """A record's time field: ISO 8601 in UTC."""
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def epoch_of(iso: str) -> float:
    """The epoch seconds of a record's time field."""
    return datetime.fromisoformat(iso).timestamp()


@dataclass(frozen=True)
class BatchRecord:
    """One batch of a run as stored in the ledger; ``revision`` is the KV revision it was read at."""

    run_id: str
    batch_id: str
    stream: str
    count: int
    first_seq: int | None = None
    last_seq: int | None = None
    state: str = PUBLISHED
    attempts: int = 0
    max_attempts: int | None = None
    owner: str | None = None
    claim_id: str | None = None
    claimed_at: str | None = None
    deadline: str | None = None
    created_at: str = ""
    updated_at: str = ""
    consumed_at: str | None = None
    failed_at: str | None = None
    last_error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    revision: int = 0
    #: Fields another service (or a newer version) stored that this version does not know; kept on update.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (XCom, logs, Spark commit messages)."""
        return asdict(self)

    def expired(self, now: float) -> bool:
        """True when this is a claim whose visibility deadline has passed."""
        return self.state == IN_PROGRESS and self.deadline is not None and epoch_of(self.deadline) <= now

    def encode(self) -> bytes:
        """The stored JSON value (checked against the record schema)."""
        body = asdict(self)
        body.pop("revision")
        extra = body.pop("extra")
        return dumped(LEDGER_RECORD_SCHEMA, {**extra, **body}, key=batch_key(self.run_id, self.batch_id))

    @classmethod
    def decode(cls, data: bytes, revision: int, key: str = "") -> BatchRecord:
        """A stored value read at ``revision``; unknown fields are kept in ``extra``."""
        body = loaded(LEDGER_RECORD_SCHEMA, data, key=key, seq=revision)
        known = {name: value for name, value in body.items() if name in _FIELDS}
        extra = {name: value for name, value in body.items() if name not in _FIELDS}
        return cls(**known, revision=revision, extra=extra)


_FIELDS = frozenset(BatchRecord.__dataclass_fields__) - {"revision", "extra"}

#: characters of a release's error kept as ``last_error``
MAX_ERROR_LENGTH = 2000


def check_location(count: int, first_seq: int | None, last_seq: int | None) -> None:
    """Raise :class:`InvalidRequestError` unless ``count`` messages fit in ``first_seq..last_seq``."""
    def is_int(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not is_int(count) or count < 0:
        raise InvalidRequestError(f"count must be an integer >= 0, got {count!r}")
    for name, value in (("first_seq", first_seq), ("last_seq", last_seq)):
        if value is not None and (not is_int(value) or value < 1):
            raise InvalidRequestError(f"{name} must be a stream sequence >= 1 or None, got {value!r}")
    if first_seq is not None and last_seq is not None:
        if first_seq > last_seq:
            raise InvalidRequestError(f"first_seq {first_seq} is after last_seq {last_seq}")
        if count > last_seq - first_seq + 1:
            raise InvalidRequestError(f"count {count} does not fit in the sequence range {first_seq}..{last_seq}")


def claimed(rec: BatchRecord, now: float, *, owner: str | None, visibility_timeout: float,
            max_attempts: int, claim_id: str) -> BatchRecord | None:
    """``published`` -> ``in_progress`` under ``claim_id`` until ``now + visibility_timeout``; None when not
    claimable. An expired claim ends first (the dead letter, when that was the last attempt)."""
    dead = ended(rec, now, max_attempts=max_attempts)
    if dead is not None and dead.state == FAILED:
        return dead
    rec = dead or rec
    if rec.state != PUBLISHED:
        return None
    return replace(rec, state=IN_PROGRESS, attempts=rec.attempts + 1, max_attempts=max_attempts, owner=owner,
                   claim_id=claim_id, claimed_at=iso_time(now), deadline=iso_time(now + visibility_timeout),
                   updated_at=iso_time(now))


def extended(rec: BatchRecord, claim: BatchRecord, now: float, *, visibility_timeout: float) -> BatchRecord:
    """The held ``claim`` with its deadline pushed to ``now + visibility_timeout``."""
    require_claim(rec, claim, "extend")
    return replace(rec, deadline=iso_time(now + visibility_timeout), updated_at=iso_time(now))


def marked_consumed(rec: BatchRecord, claim: BatchRecord, now: float) -> BatchRecord | None:
    """``in_progress`` -> ``consumed`` for the held ``claim``; None when this claim already did it."""
    if rec.state == CONSUMED and rec.claim_id == claim.claim_id:
        return None
    require_claim(rec, claim, "mark consumed")
    return replace(rec, state=CONSUMED, consumed_at=iso_time(now), updated_at=iso_time(now), deadline=None)


def ended(rec: BatchRecord, now: float, *, max_attempts: int, claim: BatchRecord | None = None,
          error: str | None = None) -> BatchRecord | None:
    """An attempt ends: the held ``claim`` given up after it failed (``error`` kept as ``last_error``), or without
    ``claim`` a claim whose deadline passed (None when ``rec`` holds none: nothing to reap). Published again, or
    failed past max attempts.

    The limit is the one the claimer set (stored with the claim), so any reaper applies it;
    ``max_attempts`` is the fallback for a record without one.
    """
    if claim is not None:
        require_claim(rec, claim, "release")
        error = str(error)[:MAX_ERROR_LENGTH]
    elif not rec.expired(now):
        return None
    reason = error or (
        f"attempt {rec.attempts} by {rec.owner or 'an unnamed consumer'} did not finish before its "
        f"visibility deadline {rec.deadline}"
    )
    cleared: dict[str, Any] = {"owner": None, "claim_id": None, "claimed_at": None, "deadline": None,
                               "updated_at": iso_time(now), "last_error": reason}
    if rec.attempts >= (rec.max_attempts or max_attempts):
        return replace(rec, state=FAILED, failed_at=iso_time(now), **cleared)
    return replace(rec, state=PUBLISHED, **cleared)


def reopened(rec: BatchRecord, now: float, *, states: Collection[str]) -> BatchRecord | None:
    """Back to ``published`` with a fresh attempt count when the record is in one of ``states``."""
    if rec.state not in states:
        return None
    return replace(rec, state=PUBLISHED, attempts=0, owner=None, claim_id=None, claimed_at=None,
                   deadline=None, consumed_at=None, failed_at=None, updated_at=iso_time(now))


def require_claim(rec: BatchRecord, claim: BatchRecord, action: str) -> None:
    """Raise :class:`ClaimLostError` unless ``rec`` is still held by ``claim``."""
    if claim.claim_id is None or rec.state != IN_PROGRESS or rec.claim_id != claim.claim_id:
        raise ClaimLostError(
            f"cannot {action} batch {rec.batch_id!r} of run {rec.run_id!r}: this claim is no longer held "
            f"(batch is {rec.state}, attempt {rec.attempts}); its visibility timeout expired and it was "
            "returned for another attempt: raise visibility_timeout or call extend() while working",
        )


def report_transition(rec: BatchRecord) -> None:
    """Count and log a batch that went back to ``published`` or on to ``failed`` (the dead letter)."""
    if rec.state == FAILED:
        metrics.incr("ledger.dead_lettered", tags={"stream": rec.stream})
        log.warning("Batch %s of run %s failed after %d attempt(s): %s", rec.batch_id, rec.run_id,
                    rec.attempts, rec.last_error)
    elif rec.state == PUBLISHED:
        metrics.incr("ledger.returned", tags={"stream": rec.stream})
        log.info("Batch %s of run %s returned for another attempt (%d so far): %s", rec.batch_id,
                 rec.run_id, rec.attempts, rec.last_error)
