"""One JetStream message, one type for every way it is read: without a consumer (direct and message gets), delivered
by a consumer, or from a range read; as a user function sees it, and as it travels through XCom.

:class:`DeliveryLease`: the server redelivers a message neither acked nor kept "in progress" within ``ack_wait``, so a
reader stalled past that (a stopped process) no longer holds it and acting on it repeats it. The lease is a local
monotonic deadline never later than the server's: from when the pull request was sent, moved by an in-progress signal
(``+WPI``) only when the server confirmed it before the old deadline. Past it: do not act on, ack, nak or term it.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

#: Bytes of a message body an asset event carries at most: Airflow keeps every event in its metadata DB.
EVENT_BODY_LIMIT = 64 * 1024
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: One stored message as a row: subject, stream sequence, timestamp (ns since epoch), headers or None, payload. The
#: Spark reader builds its columns from these without an object per message (a :class:`Message` costs about 30
#: times a tuple to make); others read them as :class:`Message` (:meth:`Message.from_stored`).
Row = tuple[str, int, int, dict[str, str] | None, bytes]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN / Infinity: Python reads them, a JSON column does not


def body_fields(data: bytes, *, limit: int = EVENT_BODY_LIMIT, where: str = "the stream") -> dict[str, Any]:
    """A message body for a JSON document, carried once: ``json`` (the parsed value, ``encoding: "json"``) when
    it is JSON, else ``data``: the UTF-8 text (``encoding: "utf-8"``) or base64 (``encoding: "base64"``).

    ``size`` is the body's length in bytes. A body longer than ``limit`` bytes keeps only its first ``limit``
    bytes, as ``data`` (text or base64), and ``truncated`` says so and where the whole message is (``where``).
    """
    fields: dict[str, Any] = {"size": len(data)}
    kept = data if len(data) <= limit else data[:limit]
    text: str | None
    try:
        text = kept.decode("utf-8")
    except UnicodeDecodeError as exc:
        cut_char = len(kept) < len(data) and exc.start >= len(kept) - 3 and is_utf8(data)
        text = kept[:exc.start].decode("utf-8") if cut_char else None
    if len(kept) < len(data):
        fields["truncated"] = (f"the body is {len(data)} bytes; only its first {len(kept)} are kept here "
                               f"(event payload limit): read the whole message from {where}")
    elif text:
        try:
            fields.update(json=json.loads(text, parse_constant=_refuse_constant), encoding="json")
            return fields
        except ValueError:
            pass
    if text is None:
        fields.update(data=base64.b64encode(kept).decode("ascii"), encoding="base64")
    else:
        fields.update(data=text, encoding="utf-8")
    return fields


def is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass(frozen=True)
class Message:
    """One message as the stream stores it: stream, subject, stream sequence, payload and headers, with ``time``
    when the stream stored it (UTC; None when the server did not say).

    ``delivered`` counts deliveries by a consumer (1 on the first; more after a nak or an expired ack wait); a
    message read without a consumer says 1. A delivery also names its ``consumer`` and ``consumer_seq``, and one
    a trigger holds for acknowledgement carries its ``lease`` (the local deadline of the delivery).
    """

    stream: str
    subject: str
    seq: int
    data: bytes
    #: The message's own headers (a repeated name keeps every value, see reading/headers.py).
    headers: dict[str, str] = field(default_factory=dict)
    time: datetime | None = None
    delivered: int = 1
    consumer: str | None = None
    consumer_seq: int | None = None
    lease: DeliveryLease | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_delivery(cls, msg: Any, lease: DeliveryLease | None = None) -> Message:
        """From a message delivered by a consumer (its reply subject carries the metadata)."""
        meta = msg.metadata
        return cls(stream=meta.stream, subject=msg.subject, seq=meta.sequence.stream, data=msg.data or b"",
                   headers=msg.headers or {}, time=meta.timestamp, delivered=meta.num_delivered or 1,
                   consumer=meta.consumer, consumer_seq=meta.sequence.consumer, lease=lease)

    @classmethod
    def from_stored(cls, stream: str, stored: Row) -> Message:
        """From a :data:`Row` (subject, seq, time in ns, headers, payload)."""
        subject, seq, nanos, headers, data = stored  # the time cut to microseconds, as the server's text is
        return cls(stream=stream, subject=subject, seq=seq, data=data or b"", headers=headers or {},
                   time=_EPOCH + timedelta(microseconds=nanos // 1000) if nanos else None)

    @property
    def text(self) -> str:
        """The payload decoded as UTF-8 (raises ``UnicodeDecodeError`` for binary payloads)."""
        return self.data.decode("utf-8")

    def json(self) -> Any:
        """The payload parsed as JSON (raises ``ValueError`` when it is not JSON)."""
        return json.loads(self.data)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for XCom: ``data`` is the text, or base64 when the payload is not UTF-8."""
        try:
            data, encoding = self.data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            data, encoding = base64.b64encode(self.data).decode("ascii"), "base64"
        return {"stream": self.stream, "subject": self.subject, "seq": self.seq, "headers": dict(self.headers),
                "data": data, "encoding": encoding, "time": self.time.isoformat() if self.time else None,
                "delivered": self.delivered}


class DeliveryLease:
    """One delivery's local deadline. ``since``: when its pull request was sent (``time.monotonic()``)."""

    __slots__ = ("ack_wait", "deadline", "dropped", "msg", "since")

    def __init__(self, msg: Any, *, ack_wait: float, since: float) -> None:
        self.msg = msg
        self.ack_wait = ack_wait
        self.since = since
        self.deadline = since + ack_wait
        self.dropped = False  # not acted on because it expired: leave it to the server

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def held_for(self) -> float:
        """Seconds since the delivery's pull request was sent."""
        return time.monotonic() - self.since

    async def extend(self, nc: Any, timeout: float) -> bool:
        """Send ``+WPI`` on ``nc`` (the connection it came on) and wait for the server's confirmation; True
        when the lease was extended."""
        import nats.errors  # here: DAG files import this module, and nats-py is loaded once a lease exists

        if self.expired():
            return False
        sent = time.monotonic()
        try:
            await nc.request(self.msg.reply, b"+WPI", timeout=timeout)
        except (nats.errors.Error, OSError):
            return False
        if time.monotonic() >= self.deadline:  # confirmed too late: the server may have redelivered meanwhile
            return False
        self.deadline = sent + self.ack_wait
        return True
