"""What the ledger stores: batch states, the KV key of a batch (``batch_key``) and :class:`BatchRecord`,
the JSON value under it (schema in record_schema.py, documented in docs/contracts.md)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from airflow_jetstream.client.errors import InvalidRequestError, LedgerConflictError
from airflow_jetstream.client.ledger.record_schema import check_record

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
        body = {**extra, **body}
        check_record(body, key=batch_key(self.run_id, self.batch_id), when="refused to write it")
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, revision: int, key: str = "") -> BatchRecord:
        """A stored value read at ``revision``; unknown fields are kept in ``extra``."""
        try:
            body = json.loads(data)
        except ValueError as exc:
            raise LedgerConflictError(
                f"ledger key {key!r} (revision {revision}) is not a batch record ({type(exc).__name__}); "
                "the bucket is used by something else: give the ledger its own bucket",
                reason="ledger_corrupt",
            ) from None
        check_record(body, key=key, when=f"read at revision {revision}")
        known = {name: value for name, value in body.items() if name in _FIELDS}
        extra = {name: value for name, value in body.items() if name not in _FIELDS}
        return cls(**known, revision=revision, extra=extra)


_FIELDS = frozenset(BatchRecord.__dataclass_fields__) - {"revision", "extra"}
