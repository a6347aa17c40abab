"""Value types, header names and local checks of the batch publishers: plain, picklable, ``to_dict()`` for XCom.

Apart from wire.py (framing), which loads nats-py: DAG files import these names.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from airflow_jetstream.client.errors import InvalidRequestError, JetStreamError
from airflow_jetstream.client.subjects import validate_subject

HEADER_BATCH_ID = "Nats-Batch-Id"
HEADER_BATCH_SEQUENCE = "Nats-Batch-Sequence"
HEADER_BATCH_COMMIT = "Nats-Batch-Commit"
HEADER_MSG_ID = "Nats-Msg-Id"
HEADER_EXPECTED_LAST_SEQ = "Nats-Expected-Last-Sequence"
HEADER_EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
HEADER_EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
#: Status of a server status message (no responders, heartbeat, end of a pull request), as nats-py parses it.
HEADER_STATUS = "Status"

#: Longest batch id the server accepts (err 10179 / 10207 above it).
MAX_BATCH_ID_LENGTH = 64
#: The server's default ``jetstream.limits.batch.max_msgs``.
DEFAULT_MAX_BATCH_MSGS = 1000
#: Messages of a fenced batch the caller gives, for the server's ``max_msgs`` (default 1000): one is the fence.
FENCED_MAX_MSGS = 999

_BATCH_HEADERS = (HEADER_BATCH_ID, HEADER_BATCH_SEQUENCE, HEADER_BATCH_COMMIT)
#: Headers a caller may not set, by batch mode: lower-case name -> what to use instead.
REFUSED_HEADERS = {
    "atomic": {
        HEADER_EXPECTED_LAST_MSG_ID.lower(): "atomic batches refuse it (server err 10177); use expected_last_seq",
        HEADER_EXPECTED_LAST_SEQ.lower(): "pass expected_last_seq to the batch publish instead",
        HEADER_EXPECTED_LAST_SUBJECT_SEQ.lower(): "set BatchMessage.expected_last_subject_seq instead",
        HEADER_MSG_ID.lower(): "set BatchMessage.msg_id instead",
        **{name.lower(): "batch headers are set by the publisher" for name in _BATCH_HEADERS},
    },
    "fast": {
        **{name.lower(): "batch headers belong to atomic batches; the fast batch protocol uses reply subjects"
           for name in _BATCH_HEADERS},
        HEADER_EXPECTED_LAST_MSG_ID.lower(): "nats-server 2.14/2.15 stop storing into a replicated stream after a "
        "mismatched one (see docs/cluster.md); use expected_last_subject_seq",
    },
}
# Batch id, sequence (up to 7 digits) and commit headers an atomic batch adds to each message.
BATCH_HEADER_BYTES = (
    len(HEADER_BATCH_ID) + MAX_BATCH_ID_LENGTH + len(HEADER_BATCH_SEQUENCE) + 7 + len(HEADER_BATCH_COMMIT) + 1
    + len(HEADER_EXPECTED_LAST_SEQ) + 20 + 4 * 4 + 12
)
_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BATCH_ID = re.compile(r"[A-Za-z0-9_\-]+")
# Bytes the protocol adds around user headers: "NATS/1.0\r\n" ... "\r\n" plus ": " and "\r\n" per header.
_HEADER_FRAME_OVERHEAD = 12
_HEADER_LINE_OVERHEAD = 4
_MSG_ID_LINE = len(HEADER_MSG_ID) + _HEADER_LINE_OVERHEAD
_PAYLOAD_TYPES = (bytes, bytearray, memoryview)


@dataclass(frozen=True)
class BatchMessage:
    """One message of a batch.

    :param subject: a concrete subject captured by the target stream.
    :param data: the payload bytes.
    :param headers: extra headers (string keys; a string value, or a list of strings for a name repeated
        on the wire, as nats.js ``append`` and Go ``Header.Add`` send).
    :param msg_id: sets ``Nats-Msg-Id`` for server-side de-duplication (makes retries safe).
    :param expected_last_subject_seq: per-subject optimistic concurrency check
        (``Nats-Expected-Last-Subject-Sequence``), checked by the server at commit.
    """

    subject: str
    data: bytes
    headers: dict[str, str] | dict[str, str | list[str]] | None = None
    msg_id: str | None = None
    expected_last_subject_seq: int | None = None


@dataclass(frozen=True)
class BatchResult:
    """Outcome of a committed batch: it occupies stream sequences ``first_seq .. last_seq``.

    ``already_committed`` is True when a retried atomic batch was found already stored (its
    msg ids are all in the stream), so nothing was written twice. For fast batches ``first_seq``
    is None: other publishers may interleave, so the range is not contiguous.
    """

    stream: str
    batch: str
    count: int
    first_seq: int | None
    last_seq: int
    already_committed: bool = False
    duplicates: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BatchItemResult:
    """Per-item outcome from the :class:`~airflow_jetstream.client.batches.batcher.Batcher`.

    On success ``error`` is ``""`` and ``stream``/``seq`` say where the message is stored; on
    failure ``error`` is a machine-readable reason (``wrong_last_sequence``, ``invalid_subject``,
    ``timeout``, ...) and ``message`` explains it.
    """

    stream: str | None = None
    seq: int | None = None
    duplicate: bool = False
    error: str = ""
    message: str = ""
    code: int | None = None
    err_code: int | None = None

    @property
    def ok(self) -> bool:
        return not self.error

    @classmethod
    def failed(cls, exc: JetStreamError) -> BatchItemResult:
        return cls(error=exc.reason, message=exc.message, code=exc.code, err_code=exc.err_code)

    def raise_for_error(self) -> BatchItemResult:
        """Return self on success, else raise the typed error of this item's reason (``timeout``:
        :class:`~airflow_jetstream.client.errors.RequestTimeoutError`, ...; one no class names: JetStreamError)."""
        if self.error:
            raise JetStreamError.of_reason(self.error)(self.message or self.error, reason=self.error, code=self.code,
                                                        err_code=self.err_code)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("code", "err_code")}


def new_batch_id() -> str:
    """A fresh batch id (32 hex characters)."""
    return uuid.uuid4().hex


def validate_batch_id(batch_id: str | None) -> str:
    """Return ``batch_id`` (or a fresh one) if the server will accept it as a batch id."""
    if batch_id is None:
        return new_batch_id()
    if not isinstance(batch_id, str) or not batch_id:
        raise InvalidRequestError(f"batch_id must be a non-empty string, got {batch_id!r}", reason="batch_id_invalid")
    if len(batch_id) > MAX_BATCH_ID_LENGTH:
        raise InvalidRequestError(
            f"batch_id is {len(batch_id)} characters; the server accepts at most {MAX_BATCH_ID_LENGTH}",
            reason="batch_id_invalid",
        )
    if not _BATCH_ID.fullmatch(batch_id):
        raise InvalidRequestError(
            f"batch_id {batch_id!r} may only contain letters, digits, '-' and '_'", reason="batch_id_invalid"
        )
    return batch_id


def header_size(headers: Mapping[str, str | list[str]]) -> int:
    """Bytes the headers take on the wire (a list value is one line per value)."""
    if not headers:
        return 0
    return _HEADER_FRAME_OVERHEAD + sum(len(k) + len(v.encode()) + _HEADER_LINE_OVERHEAD
                                        for k, values in headers.items() for v in header_values(values))


def header_values(value: str | list[str]) -> list[str]:
    """The values of one header: a list (a repeated header) or one string."""
    return [value] if isinstance(value, str) else value


def _check_headers(index: int, headers: object, refused: dict[str, str]) -> dict[str, str]:
    if not isinstance(headers, dict):
        raise InvalidRequestError(f"message {index}: headers must be a dict, got {type(headers).__name__}",
                                  reason="invalid_header")
    for key, value in headers.items():
        if not isinstance(key, str) or not _HEADER_KEY.fullmatch(key):
            raise InvalidRequestError(f"message {index}: header name {key!r} is not a valid NATS header name",
                                      reason="invalid_header")
        values = value if isinstance(value, list) and value else [value]
        if any(not isinstance(v, str) or "\r" in v or "\n" in v for v in values):
            raise InvalidRequestError(
                f"message {index}: header {key!r} must be a string (or a non-empty list of strings for a "
                "repeated header) without line breaks", reason="invalid_header"
            )
        hint = refused.get(key.lower())
        if hint is not None:
            raise InvalidRequestError(f"message {index}: header {key!r} is not allowed here; {hint}",
                                      reason="unsupported_header")
    return headers


def validate_messages(
    messages: Sequence[BatchMessage],
    *,
    mode: str,
    max_payload: int,
    max_msgs: int | None,
    reserved_header_bytes: int | None = None,
) -> list[BatchMessage]:
    """Check a whole ``mode`` batch locally and return it as a list; raises :class:`InvalidRequestError` subclasses.

    ``max_msgs`` is the server's batch size limit (None: not checked, for a fast batch or one message);
    ``reserved_header_bytes`` is what the publisher adds to every message (default: an atomic batch's headers).
    """
    refused_headers = REFUSED_HEADERS[mode]
    if reserved_header_bytes is None:
        reserved_header_bytes = BATCH_HEADER_BYTES if mode == "atomic" else 0
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidRequestError("messages must be a sequence of BatchMessage", reason="invalid_request")
    items = list(messages)
    if not items:
        raise InvalidRequestError("the batch is empty; give at least one message", reason="empty_batch")
    if max_msgs is not None and len(items) > max_msgs:
        raise InvalidRequestError(
            f"the batch has {len(items)} messages, more than the limit of {max_msgs} per batch "
            "(server jetstream.limits.batch.max_msgs); split it into smaller batches",
            reason="batch_too_large",
        )
    seen_ids: dict[str, int] = {}
    # Subjects already found valid in this batch: a batch usually repeats a few subjects, so each
    # distinct one is parsed once (membership is only tested for exact str values).
    valid_subjects: set[str] = set()
    payload_types = _PAYLOAD_TYPES
    for index, msg in enumerate(items):
        if not isinstance(msg, BatchMessage):
            raise InvalidRequestError(f"message {index} is a {type(msg).__name__}, not a BatchMessage",
                                      reason="invalid_request")
        subject = msg.subject
        if type(subject) is not str or subject not in valid_subjects:
            validate_subject(subject, what=f"message {index} subject")
            valid_subjects.add(subject)
        data = msg.data
        if not isinstance(data, payload_types):
            raise InvalidRequestError(f"message {index}: data must be bytes, got {type(data).__name__}",
                                      reason="invalid_payload")
        size = len(data) + reserved_header_bytes
        if msg.headers is not None:
            size += header_size(_check_headers(index, msg.headers, refused_headers))
        msg_id = msg.msg_id
        if msg_id is not None:
            if not isinstance(msg_id, str) or not msg_id or "\r" in msg_id or "\n" in msg_id:
                raise InvalidRequestError(f"message {index}: msg_id must be a non-empty single-line string",
                                          reason="invalid_msg_id")
            first = seen_ids.setdefault(msg_id, index)
            if first != index:
                raise InvalidRequestError(
                    f"messages {first} and {index} share msg_id {msg_id!r}; "
                    "msg ids must be unique within a batch",
                    reason="duplicate_msg_id",
                )
            size += _MSG_ID_LINE + len(msg_id)
        if msg.expected_last_subject_seq is not None:
            if not isinstance(msg.expected_last_subject_seq, int) or msg.expected_last_subject_seq < 0:
                raise InvalidRequestError(f"message {index}: expected_last_subject_seq must be an int >= 0",
                                          reason="invalid_request")
            size += len(HEADER_EXPECTED_LAST_SUBJECT_SEQ) + 20 + _HEADER_LINE_OVERHEAD
        if size > max_payload:
            raise InvalidRequestError(
                f"message {index} ({subject}) is {size} bytes with headers, over the connection's "
                f"max_payload of {max_payload} bytes; make it smaller or raise the server's max_payload",
                reason="payload_too_large",
            )
    return items
