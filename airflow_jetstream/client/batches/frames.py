"""Wire framing of the batch publishers: NATS ``PUB``/``HPUB`` frames written to the socket in one go.

The batch publishers encode whole runs of messages as NATS protocol frames and hand them to the
connection in one write: per-message ``nc.publish`` calls cost more Python time than the server
needs to store a message, which would make the client the bottleneck of every batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_jetstream.client.batches.types import (
    HEADER_EXPECTED_LAST_SUBJECT_SEQ,
    HEADER_MSG_ID,
    BatchMessage,
    header_values,
)
from airflow_jetstream.client.natspy_internals import write_raw

_HEADER_START = b"NATS/1.0\r\n"


def encode_header_lines(headers: Mapping[str, str | list[str]]) -> bytes:
    """``Key: Value\r\n`` lines for ``headers`` (already validated: no line breaks), one per value of a list."""
    return "".join(f"{k}: {v}\r\n" for k, values in headers.items() for v in header_values(values)).encode()


_MSG_ID_PREFIX = f"{HEADER_MSG_ID}: ".encode()
_EXPECTED_SUBJECT_SEQ_PREFIX = f"{HEADER_EXPECTED_LAST_SUBJECT_SEQ}: ".encode()


def message_header_lines(msg: BatchMessage) -> bytes:
    """The user-level header lines of ``msg``: its own headers, then its msg id and per-subject expectation."""
    lines = encode_header_lines(msg.headers) if msg.headers else b""
    if msg.msg_id is not None:
        lines += b"%b%b\r\n" % (_MSG_ID_PREFIX, msg.msg_id.encode())
    if msg.expected_last_subject_seq is not None:
        lines += b"%b%d\r\n" % (_EXPECTED_SUBJECT_SEQ_PREFIX, msg.expected_last_subject_seq)
    return lines


def encode_frame(subject: bytes, reply: bytes, header_lines: bytes, payload: bytes) -> bytes:
    """One ``HPUB`` (or ``PUB`` when there are no headers) protocol frame with a reply subject."""
    if not header_lines:
        return b"PUB %b %b %d\r\n%b\r\n" % (subject, reply, len(payload), payload)
    hdr_len = len(_HEADER_START) + len(header_lines) + 2
    return b"HPUB %b %b %d %d\r\nNATS/1.0\r\n%b\r\n%b\r\n" % (
        subject, reply, hdr_len, hdr_len + len(payload), header_lines, payload)


async def write_frames(nc: Any, frames: bytes) -> None:
    """Queue already-encoded protocol frames on the nats-py connection and kick its flusher
    (:func:`~airflow_jetstream.client.natspy_internals.write_raw`: nats-py has no public raw write)."""
    await write_raw(nc, frames)
