"""JetStreamAtomicBatchPublishOperator: publish a list, a file or a producer function's messages as batches."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.batches.types import (
    DEFAULT_MAX_BATCH_MSGS,
    FENCED_MAX_MSGS,
    BatchMessage,
    new_batch_id,
    validate_messages,
)
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.reading.apply_function import load_function
from airflow_jetstream.operators.base import JetStreamBaseOperator
from airflow_jetstream.ui.links import JetStreamViewLink

if TYPE_CHECKING:
    from airflow_jetstream.client.batches.publish_chunks import ChunksSummary
    from airflow_jetstream.client.connection import JetStreamConnection

MESSAGE_KEYS = frozenset({"subject", "data", "headers", "msg_id"})


def messages_summary(messages: Any) -> str:
    """What the ``messages`` field shows in the DAG and in rendered templates instead of the payloads."""
    if isinstance(messages, (list, tuple)):
        return f"{len(messages)} message(s); payloads are not kept in rendered fields"
    if isinstance(messages, str):
        return f"{len(messages)} characters of JSON; payloads are not kept in rendered fields"
    return f"a {type(messages).__name__}; payloads are not kept in rendered fields"


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
                        headers={str(k): [str(x) for x in v] if isinstance(v, list) else str(v)
                                 for k, v in headers.items()} if headers else None,
                        msg_id=str(msg_id) if msg_id is not None else None)


def read_messages_file(path: str, *, parquet_batch_rows: int = DEFAULT_MAX_BATCH_MSGS) -> Iterator[dict[str, Any]]:
    """Message dicts from a JSON Lines file (line by line), or from a Parquet file (``.parquet``, needs
    pyarrow; read one record batch of ``parquet_batch_rows`` at a time)."""
    if not os.path.isfile(path):
        raise InvalidRequestError(f"messages_file {path!r} does not exist", reason="file_not_found")
    if path.endswith((".parquet", ".pq")):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise InvalidRequestError("reading Parquet needs pyarrow: pip install 'airflow-jetstream[spark]', "
                                      "or write JSON Lines", reason="pyarrow_missing") from None
        for batch in pq.ParquetFile(path).iter_batches(batch_size=parquet_batch_rows):
            yield from batch.to_pylist()
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


def task_dedupe_key(context: Any) -> str | None:
    """A msg id prefix naming this task instance (dag, task, run, map index; not the try number), or None."""
    ti = (context or {}).get("ti") or (context or {}).get("task_instance")
    if ti is None:
        return None
    identity = "|".join(str(getattr(ti, name, "")) for name in ("dag_id", "task_id", "run_id", "map_index"))
    return "pf-" + hashlib.sha256(identity.encode()).hexdigest()[:24]


class JetStreamAtomicBatchPublishOperator(JetStreamBaseOperator):
    """Publish messages to JetStream as atomic batches (or fast batches), streaming any input size.

    Messages come from exactly one of ``messages`` (a list, or an upstream task's XCom), ``messages_file``
    (JSON Lines, or Parquet with pyarrow) or ``producer_function`` (an iterable, usually a generator). Memory is
    bounded by one chunk of ``batch_size`` messages. ``messages`` and ``messages_file`` are validated whole
    before the first message is sent; more than ``batch_size`` messages fail unless ``split=True`` (each chunk
    is then its own all-or-nothing batch). A ``producer_function`` is read once, so its messages get
    deterministic msg ids (``dedupe_key`` or one derived from the task instance) and each atomic chunk is
    fenced: a retry or re-run stores nothing an earlier try committed, however late.

    Returns a summary of constant size (``count``, ``chunks``, ``first_seq``, ``last_seq``, ``batch_prefix``,
    ...). Parameters, results and examples: docs/operators/publish.md.
    """

    template_fields: Sequence[str] = ("messages", "messages_file", "subject", "stream", "expected_last_seq",
                                      "dedupe_key", "producer_function_args", "producer_function_kwargs")
    template_fields_renderers = {"messages": "json", "producer_function_kwargs": "json"}
    operator_extra_links = (JetStreamViewLink(),)

    def __init__(self, *, messages: list[dict[str, Any]] | str | None = None, messages_file: str | None = None,
                 producer_function: str | Callable[..., Iterable[dict[str, Any]]] | None = None,
                 producer_function_args: Sequence[Any] | None = None,
                 producer_function_kwargs: dict[str, Any] | None = None, subject: str | None = None,
                 stream: str | None = None, expected_last_seq: int | str | None = None, split: bool = False,
                 batch_size: int | None = None, dedupe_key: str | None = None, mode: str = "atomic", fence: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # The payloads live in _payloads; ``messages`` (the template field, stored in the serialized DAG
        # and in rendered fields) shows a summary.
        self._payloads: Any = messages if isinstance(messages, (list, tuple)) else None
        self.messages = messages_summary(messages) if self._payloads is not None else messages
        self.messages_file = messages_file
        self.producer_function = producer_function
        self.producer_function_args = producer_function_args
        self.producer_function_kwargs = producer_function_kwargs
        self.subject = subject
        self.stream = stream
        self.expected_last_seq = expected_last_seq
        self.split = split
        self.batch_size = batch_size
        self.dedupe_key = dedupe_key
        self.mode = mode
        self.fence = fence

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render the templated fields, ``messages`` included, keeping its payloads for :meth:`execute`:
        the field itself then shows a summary, so payloads stay out of rendered fields and the UI."""
        super().render_template_fields(context, jinja_env)
        if self._payloads is not None:  # a list given in the DAG file
            self._payloads = self.render_template(self._payloads, context, jinja_env)
        elif self.messages is not None:  # an XComArg or a string (a JSON list, an XCom pull)
            self._payloads, self.messages = self.messages, messages_summary(self.messages)

    def _check_sources(self) -> None:
        given = [self.messages is not None, bool(self.messages_file), self.producer_function is not None]
        if sum(given) != 1:
            raise InvalidRequestError("give exactly one of messages=, messages_file= or producer_function=",
                                      reason="invalid_request")
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise InvalidRequestError(f"batch_size must be an int >= 1, got {self.batch_size!r}",
                                      reason="invalid_request")

    def _items(self) -> Iterator[Any]:
        """A fresh pass over the input's message dicts."""
        if self.messages_file:
            return read_messages_file(self.messages_file, parquet_batch_rows=self.batch_size or DEFAULT_MAX_BATCH_MSGS)
        if self.producer_function is not None:
            return self._produce(self.producer_function)
        messages = self._payloads if self._payloads is not None else self.messages
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except ValueError as exc:
                raise InvalidRequestError(f"messages is a string but not a JSON list ({exc.args[0]})",
                                          reason="invalid_message") from None
        if isinstance(messages, dict) or not isinstance(messages, (list, tuple)):
            raise InvalidRequestError(f"messages must be a list of dicts, got {type(messages).__name__}",
                                      reason="invalid_message")
        return iter(messages)

    def _produce(self, producer: str | Callable[..., Iterable[dict[str, Any]]]) -> Iterator[Any]:
        function = load_function(producer, what="producer_function")
        produced = function(*(self.producer_function_args or ()), **(self.producer_function_kwargs or {}))
        if isinstance(produced, (str, bytes, dict)) or not isinstance(produced, Iterable):
            raise InvalidRequestError(f"producer_function must return an iterable (e.g. a generator) of message "
                                      f"dicts, got {type(produced).__name__}", reason="invalid_message")
        return iter(produced)

    def _chunks(self, items: Iterator[Any], key: str | None) -> Iterator[list[BatchMessage]]:
        """The input as chunks of at most ``batch_size`` messages; one chunk is held at a time."""
        chunk: list[BatchMessage] = []
        for index, item in enumerate(items):
            if len(chunk) == self.batch_size:
                if not self.split and self.mode == "atomic":
                    raise InvalidRequestError(
                        f"more than {self.batch_size} messages, more than one atomic batch allows; set split=True "
                        "to publish them as several atomic batches (each all-or-nothing)", reason="batch_too_large")
                yield chunk
                chunk = []
            chunk.append(to_batch_message(item, index, self.subject, key))
        if chunk:
            yield chunk

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
        if self.mode != "atomic":
            raise InvalidRequestError("expected_last_seq needs mode='atomic' (fast batches do not check it)",
                                      reason="invalid_request")
        return value

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_jetstream.client.batches.publish_chunks import check_mode

        key = self.dedupe_key
        if self.producer_function is not None and not key:
            key = task_dedupe_key(context)
            if key is None:
                raise InvalidRequestError("producer_function needs deterministic msg ids: give dedupe_key, or run "
                                          "the operator as an Airflow task", reason="invalid_request")
        fence_prefix = key if key and self.fence and self.mode == "atomic" else None
        if self.batch_size is None:
            self.batch_size = FENCED_MAX_MSGS if fence_prefix else DEFAULT_MAX_BATCH_MSGS
        self._check_sources()
        check_mode(self.mode)
        expected = self._expected()
        prefix = new_batch_id()[:16]
        summary = self.hook.run(self._publish, expected=expected, key=key, fence_prefix=fence_prefix, prefix=prefix)
        result = {**summary.to_dict(), "batch_prefix": prefix, "msg_id_prefix": key}
        self.log.info("Committed %d message(s) to %s in %d %s batch(es), seq %s..%s (batch ids %s-1..%s-%d)",
                      result["count"], result["stream"], result["chunks"], self.mode, result["first_seq"],
                      result["last_seq"], prefix, prefix, result["chunks"])
        return result

    async def _publish(self, conn: JetStreamConnection, *, expected: int | None, key: str | None,
                       fence_prefix: str | None, prefix: str) -> ChunksSummary:
        from airflow_jetstream.client.batches.publish_chunks import check_target_stream, publish_chunks

        size = self.batch_size or DEFAULT_MAX_BATCH_MSGS
        target = await check_target_stream(conn, self.stream, mode=self.mode,
                                           fence=fence_prefix is not None) if self.stream else None
        delay = self.retry_delay.total_seconds() if self.retries and self.retry_delay else 0.0
        if target is not None and key and not fence_prefix and delay > target.duplicate_window:
            self.log.warning("retry_delay is %.0f s but stream %s remembers msg ids for %.0f s (duplicate_window): "
                             "a retry after that publishes again; raise the stream's duplicate_window",
                             delay, target.name, target.duplicate_window)
        total_chunks = None
        if self.producer_function is None:
            count, total_chunks = 0, 0
            for chunk in self._chunks(self._items(), key):
                validate_messages(chunk, mode=self.mode, max_msgs=size if self.mode == "atomic" else None,
                                  max_payload=conn.nc.max_payload)
                if target is not None:
                    await target.require(conn, {m.subject for m in chunk})
                count, total_chunks = count + len(chunk), total_chunks + 1
            if not count:
                raise InvalidRequestError("there are no messages to publish", reason="empty_batch")
            self.log.info("Validated %d message(s); publishing them as %d %s batch(es) of at most %d", count,
                          total_chunks, self.mode, size)
        return await publish_chunks(conn, self._chunks(self._items(), key), target=target, mode=self.mode,
                                    expected_last_seq=expected, max_msgs=size, batch_prefix=prefix,
                                    fence_prefix=fence_prefix, total_chunks=total_chunks, log=self.log)
