"""JetStreamAtomicBatchPublishOperator: publish a list or file of messages as atomic batches."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.batches.atomic import publish_atomic_batch, streams_for_subject
from airflow_jetstream.client.batches.types import DEFAULT_MAX_BATCH_MSGS, BatchMessage, BatchResult
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import BatchPublishError, InvalidRequestError, JetStreamError
from airflow_jetstream.operators.base import JetStreamBaseOperator

MESSAGE_KEYS = frozenset({"subject", "data", "headers", "msg_id"})


def to_batch_message(item: Any, index: int, default_subject: str | None, dedupe_key: str | None) -> BatchMessage:
    """One message dict (``subject``, ``data``, ``headers``, ``msg_id``) as a :class:`BatchMessage`.

    ``data`` may be str (sent as UTF-8), bytes, or anything JSON-serialisable (sent as JSON).
    """
    if not isinstance(item, dict):
        raise InvalidRequestError(f"message {index} must be a dict with 'subject'/'data', got {type(item).__name__}",
                                  reason="invalid_message")
    unknown = sorted(set(item) - MESSAGE_KEYS)
    if unknown:
        raise InvalidRequestError(f"message {index} has unknown key(s) {', '.join(unknown)}; use "
                                  f"{', '.join(sorted(MESSAGE_KEYS))}", reason="invalid_message")
    subject = item.get("subject") or default_subject
    if not subject:
        raise InvalidRequestError(f"message {index} has no 'subject' and the operator has no default subject",
                                  reason="invalid_message")
    data = item.get("data")
    if isinstance(data, bytes):
        payload = data
    elif isinstance(data, str):
        payload = data.encode()
    elif data is None:
        payload = b""
    else:
        try:
            payload = json.dumps(data, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"message {index}: data is not JSON-serialisable ({exc})",
                                      reason="invalid_payload") from None
    headers = item.get("headers")
    if isinstance(headers, list):  # a Parquet map column reads as a list of (key, value) pairs
        headers = dict(headers)
    if headers is not None and not isinstance(headers, dict):
        raise InvalidRequestError(f"message {index}: headers must be a dict", reason="invalid_header")
    msg_id = item.get("msg_id")
    if msg_id is None and dedupe_key:
        msg_id = f"{dedupe_key}-{index}"
    return BatchMessage(subject=subject, data=payload,
                        headers={str(k): str(v) for k, v in headers.items()} if headers else None,
                        msg_id=str(msg_id) if msg_id is not None else None)


def read_messages_file(path: str) -> Iterator[dict[str, Any]]:
    """Message dicts from a JSON Lines file, or from a Parquet file (``.parquet``, needs pyarrow)."""
    if not os.path.isfile(path):
        raise InvalidRequestError(f"messages_file {path!r} does not exist", reason="file_not_found")
    if path.endswith((".parquet", ".pq")):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise InvalidRequestError("reading Parquet needs pyarrow: pip install 'airflow-jetstream[spark]', "
                                      "or write JSON Lines", reason="pyarrow_missing") from None
        yield from pq.read_table(path).to_pylist()
        return
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError as exc:
                raise InvalidRequestError(f"{path}:{number} is not valid JSON ({exc.args[0]})",
                                          reason="invalid_message") from None


async def check_target_stream(conn: JetStreamConnection, stream: str, subjects: set[str]) -> None:
    """Fail before publishing unless ``stream`` allows atomic batches and captures every subject."""
    info = await stream_info(conn, stream)
    if not info["config"].get("allow_atomic"):
        raise BatchPublishError(f"stream {stream!r} does not allow atomic batches; set allow_atomic: true "
                                "(JetStreamEnsureStreamOperator)", reason="stream_not_atomic")
    owners = await asyncio.gather(*(streams_for_subject(conn, subject) for subject in sorted(subjects)))
    for subject, names in zip(sorted(subjects), owners, strict=True):
        if names != [stream]:
            where = f"stream {names[0]!r}" if names else "no stream"
            raise BatchPublishError(f"subject {subject!r} is captured by {where}, not by {stream!r}; fix the "
                                    "subject or the stream", reason="wrong_stream")


async def publish_chunks(conn: JetStreamConnection, chunks: list[list[BatchMessage]], *, stream: str | None,
                         expected_last_seq: int | None, max_msgs: int, log: Any) -> list[BatchResult]:
    """Publish each chunk as one atomic batch; chunk k+1 expects the stream to end where chunk k did."""
    if stream:
        await check_target_stream(conn, stream, {m.subject for chunk in chunks for m in chunk})
    results: list[BatchResult] = []
    expected = expected_last_seq
    for number, chunk in enumerate(chunks, start=1):
        try:
            result = await publish_atomic_batch(conn, chunk, expected_last_seq=expected, max_msgs=max_msgs)
        except JetStreamError as exc:
            if not results:
                raise
            done = ", ".join(f"{r.first_seq}..{r.last_seq}" for r in results)
            raise BatchPublishError(
                f"chunk {number}/{len(chunks)} failed after chunks 1..{number - 1} were committed (seqs {done}): "
                f"{exc.message}. Set dedupe_key so a retry skips the committed chunks",
                reason=exc.reason, code=exc.code, err_code=exc.err_code, description=exc.description,
            ) from None
        log.info("chunk %d/%d: %d message(s) committed to %s, seq %s..%s%s", number, len(chunks), result.count,
                 result.stream, result.first_seq, result.last_seq,
                 " (already committed earlier)" if result.already_committed else "")
        results.append(result)
        if expected is not None:
            expected = result.last_seq
    return results


class JetStreamAtomicBatchPublishOperator(JetStreamBaseOperator):
    """Publish messages to JetStream as all-or-nothing atomic batches.

    Messages come from ``messages`` (a templated list, or an upstream task's XCom such as
    ``producer.output``) or from ``messages_file`` (JSON Lines, or Parquet when pyarrow is
    installed), e.g. a file a Spark job wrote. Each message is a dict with ``subject`` (or the
    operator's ``subject``), ``data`` (str, bytes or anything JSON-serialisable, sent as JSON) and
    optional ``headers`` and ``msg_id``. The stream needs ``allow_atomic: true``.

    More messages than one batch allows (``max_msgs``, the server's limit, 1000 by default) fail
    before anything is sent, unless ``split=True``: then each chunk is its own atomic batch and, when
    ``expected_last_seq`` is set, each chunk must start where the previous one ended. Returns
    ``{"stream", "batch", "count", "first_seq", "last_seq"}`` (plus ``"chunks"`` when split)::

        publish = JetStreamAtomicBatchPublishOperator(
            task_id="publish_orders",
            messages_file="/data/{{ ds }}/orders.jsonl",
            subject="orders.new",
            stream="ORDERS",
            split=True,
            dedupe_key="orders-{{ ds }}",   # msg ids: a retried task does not publish twice
        )

    :param messages: list of message dicts, or a JSON string of one (templated).
    :param messages_file: path of a JSON Lines or Parquet file of message dicts (templated).
    :param subject: default subject for messages without one (templated).
    :param stream: the stream the messages must land in; checked before publishing (templated).
    :param expected_last_seq: the stream's last sequence before the (first) batch (templated).
    :param split: allow more than ``max_msgs`` messages, as several atomic batches.
    :param max_msgs: messages per batch (the server's ``jetstream.limits.batch.max_msgs``).
    :param dedupe_key: prefix for automatic msg ids (``<key>-<index>``) of messages without one (templated).
    :param nats_conn_id: the ``nats`` connection to use.
    """

    template_fields: Sequence[str] = (
        "messages", "messages_file", "subject", "stream", "expected_last_seq", "dedupe_key",
    )
    template_fields_renderers = {"messages": "json"}
    ui_color = "#27aae1"

    def __init__(
        self,
        *,
        messages: list[dict[str, Any]] | str | None = None,
        messages_file: str | None = None,
        subject: str | None = None,
        stream: str | None = None,
        expected_last_seq: int | str | None = None,
        split: bool = False,
        max_msgs: int = DEFAULT_MAX_BATCH_MSGS,
        dedupe_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.messages = messages
        self.messages_file = messages_file
        self.subject = subject
        self.stream = stream
        self.expected_last_seq = expected_last_seq
        self.split = split
        self.max_msgs = max_msgs
        self.dedupe_key = dedupe_key

    def _load(self) -> list[dict[str, Any]]:
        if (self.messages is None) == (not self.messages_file):
            raise InvalidRequestError("give exactly one of messages= or messages_file=", reason="invalid_request")
        if self.messages_file:
            return list(read_messages_file(self.messages_file))
        messages = self.messages
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except ValueError as exc:
                raise InvalidRequestError(f"messages is a string but not a JSON list ({exc.args[0]})",
                                          reason="invalid_message") from None
        if isinstance(messages, dict) or not isinstance(messages, (list, tuple)):
            raise InvalidRequestError(f"messages must be a list of dicts, got {type(messages).__name__}",
                                      reason="invalid_message")
        return list(messages)

    def _expected(self) -> int | None:
        if self.expected_last_seq in (None, ""):
            return None
        try:
            value = int(self.expected_last_seq)
        except (TypeError, ValueError):
            raise InvalidRequestError(f"expected_last_seq must be an integer, got {self.expected_last_seq!r}",
                                      reason="invalid_request") from None
        if value < 0:
            raise InvalidRequestError("expected_last_seq must be >= 0", reason="invalid_request")
        return value

    def execute(self, context: Any) -> dict[str, Any]:
        raw = self._load()
        expected = self._expected()
        messages = [to_batch_message(item, i, self.subject, self.dedupe_key) for i, item in enumerate(raw)]
        if not messages:
            raise InvalidRequestError("there are no messages to publish", reason="empty_batch")
        if len(messages) > self.max_msgs and not self.split:
            raise InvalidRequestError(
                f"{len(messages)} messages are more than one atomic batch allows ({self.max_msgs}); set "
                "split=True to publish them as several atomic batches (each all-or-nothing)",
                reason="batch_too_large",
            )
        chunks = [messages[i:i + self.max_msgs] for i in range(0, len(messages), self.max_msgs)]
        self.log.info("Publishing %d message(s) as %d atomic batch(es) of at most %d", len(messages), len(chunks),
                      self.max_msgs)
        results = self.hook.run(publish_chunks, chunks, stream=self.stream, expected_last_seq=expected,
                                max_msgs=self.max_msgs, log=self.log)
        first, last = results[0], results[-1]
        summary: dict[str, Any] = {
            "stream": first.stream,
            "batch": first.batch,
            "count": sum(r.count for r in results),
            "first_seq": first.first_seq,
            "last_seq": last.last_seq,
            "already_committed": all(r.already_committed for r in results),
        }
        if self.split:
            summary["chunks"] = [r.to_dict() for r in results]
        self.log.info("Committed %d message(s) to %s, seq %s..%s", summary["count"], summary["stream"],
                      summary["first_seq"], summary["last_seq"])
        return summary
