"""Check the target stream and publish chunks as batches, in memory bounded by one chunk: what the publish operator
and the Spark writer share (summarised by counts, so the result does not grow with the number of chunks)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_jetstream.client.admin.streams import stream_info, streams_for_subject
from airflow_jetstream.client.batches.atomic import check_fence_config, publish_atomic_batch, publish_fenced_batch
from airflow_jetstream.client.batches.fast import DEFAULT_FLOW, publish_fast_batch
from airflow_jetstream.client.batches.types import DEFAULT_MAX_BATCH_MSGS, BatchMessage, BatchResult
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import BatchPublishError, FastBatchError, InvalidRequestError, JetStreamError
from airflow_jetstream.client.subjects import subject_matches

#: Batch modes: ``atomic`` (all-or-nothing per chunk) and ``fast`` (flow-controlled bulk ingest).
MODES = ("atomic", "fast")
_MODE_FLAG = {"atomic": ("allow_atomic", "stream_not_atomic"), "fast": ("allow_batched", "stream_not_batched")}
# Subjects already found captured; reset when full so a file of unique subjects stays bounded.
_SUBJECT_CACHE = 4096
# Chunk log lines: the first few, then every N-th, then the last.
_LOG_FIRST = 10
_LOG_EVERY = 100


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise InvalidRequestError(f"mode must be one of {', '.join(MODES)}, got {mode!r}", reason="invalid_request")
    return mode


@dataclass
class TargetStream:
    """A stream checked for a batch mode. JetStream refuses overlapping subjects between streams, so a subject
    matching one of its filters is captured by it and no other: :meth:`require` checks locally, and asks the server
    only when that fails (to name the stream that does capture it)."""

    name: str
    filters: tuple[str, ...]
    #: The stream's duplicate window in seconds: how long a msg id protects against a re-send.
    duplicate_window: float = 120.0
    #: Whether atomic chunks with a fence id are fenced (the stream was checked for its fence subjects).
    fenced: bool = False
    _known: set[str] = field(default_factory=set, repr=False)

    def captures(self, subject: str) -> bool:
        if subject in self._known:
            return True
        if not any(subject_matches(pattern, subject) for pattern in self.filters):
            return False
        if len(self._known) >= _SUBJECT_CACHE:
            self._known.clear()
        self._known.add(subject)
        return True

    async def require(self, conn: JetStreamConnection, subjects: Iterable[str]) -> None:
        """Raise ``wrong_stream`` for the first subject this stream does not capture."""
        for subject in subjects:
            if self.captures(subject):
                continue
            owners = await streams_for_subject(conn, subject)
            where = f"stream {owners[0]!r}" if owners else "no stream"
            raise BatchPublishError(f"subject {subject!r} is captured by {where}, not by {self.name!r}; fix the "
                                    "subject or the stream", reason="wrong_stream")


async def check_target_stream(conn: JetStreamConnection, stream: str, subjects: Iterable[str] = (), *,
                              mode: str = "atomic", fence: bool = False) -> TargetStream:
    """Fail before publishing unless ``stream`` allows ``mode`` batches and captures every subject; with ``fence``
    (atomic mode) it must also keep fences, and chunks published to it with a fence id commit at most once."""
    flag, reason = _MODE_FLAG[check_mode(mode)]
    config = (await stream_info(conn, stream))["config"]
    if not config.get(flag):
        raise BatchPublishError(f"stream {stream!r} does not have {flag}: true, which {mode} batches need; set it "
                                f"on the stream (JetStreamEnsureStreamOperator with {flag}=True)", reason=reason)
    fenced = fence and mode == "atomic"
    if fenced:
        check_fence_config(stream, config)
    target = TargetStream(stream, tuple(config.get("subjects") or [stream]),
                          duplicate_window=int(config.get("duplicate_window") or 120_000_000_000) / 1e9, fenced=fenced)
    await target.require(conn, subjects)
    return target


async def publish_chunk(conn: JetStreamConnection, messages: Sequence[BatchMessage], *, mode: str = "atomic",
                        batch_id: str | None = None, expected_last_seq: int | None = None,
                        max_msgs: int = DEFAULT_MAX_BATCH_MSGS, flow: int = DEFAULT_FLOW,
                        target: TargetStream | None = None, fence_id: str | None = None) -> BatchResult:
    """One chunk as an atomic batch (``expected_last_seq``, ``max_msgs``) or a fast batch (``flow``).

    An atomic chunk with ``fence_id`` to a ``target`` checked with ``fence=True`` is fenced: it commits at most
    once, and a later attempt returns the earlier commit (``already_committed``) whenever it happens."""
    if check_mode(mode) == "atomic":
        if fence_id is not None and target is not None and target.fenced:
            return await publish_fenced_batch(conn, messages, stream=target.name, fence_id=fence_id,
                                              batch_id=batch_id, expected_last_seq=expected_last_seq,
                                              max_msgs=max_msgs + 1)  # max_msgs of the caller's, and the fence
        return await publish_atomic_batch(conn, messages, batch_id=batch_id, expected_last_seq=expected_last_seq,
                                          max_msgs=max_msgs)
    return await publish_fast_batch(conn, messages, batch_id=batch_id, flow=flow)


@dataclass
class ChunksSummary:
    """Counts over every published chunk (constant size). ``count`` is what the server accepted; for fast batches
    it includes messages skipped as duplicates of stored msg ids, of which ``duplicates`` counts those the client
    could establish, so ``stored_exact`` is False there. ``first_seq``/``last_seq`` bound this publish's sequences
    (other publishers may interleave)."""

    stream: str = ""
    mode: str = "atomic"
    batch: str | None = None
    chunks: int = 0
    count: int = 0
    already_committed_chunks: int = 0
    duplicates: int = 0
    first_seq: int | None = None
    last_seq: int | None = None

    def add(self, result: BatchResult) -> None:
        self.stream = self.stream or result.stream
        self.batch = self.batch or result.batch
        self.chunks += 1
        self.count += result.count
        self.already_committed_chunks += int(result.already_committed)
        self.duplicates += result.duplicates
        if result.first_seq is not None and self.first_seq is None:
            self.first_seq = result.first_seq
        self.last_seq = result.last_seq

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "already_committed": self.chunks > 0 and self.already_committed_chunks == self.chunks,
                "stored_exact": self.mode == "atomic"}


async def publish_chunks(
    conn: JetStreamConnection,
    chunks: Iterable[Sequence[BatchMessage]],
    *,
    stream: str | None = None,
    target: TargetStream | None = None,
    mode: str = "atomic",
    expected_last_seq: int | None = None,
    max_msgs: int = DEFAULT_MAX_BATCH_MSGS,
    flow: int = DEFAULT_FLOW,
    batch_prefix: str | None = None,
    fence_prefix: str | None = None,
    total_chunks: int | None = None,
    log: Any = None,
) -> ChunksSummary:
    """Publish each chunk as one batch, one after the other; holds one chunk at a time.

    With ``stream`` the stream is checked for ``mode`` first and every chunk's subjects before the chunk is sent;
    ``target``, the stream as :func:`check_target_stream` already checked it for ``mode`` (and with ``fence`` when
    fenced), is not asked for again. In atomic mode with ``expected_last_seq``, chunk k+1
    expects the stream to end where chunk k did. ``batch_prefix`` makes batch ids deterministic (``<prefix>-<n>``).
    With ``fence_prefix`` (atomic mode) chunk n is fenced as ``<fence_prefix>-<n>``: it commits at most once
    however often and however late the publish is repeated (the stream, ``stream`` or the one capturing the
    first subject, must keep fences). A failed chunk raises with what the earlier chunks committed; chunks
    are all-or-nothing each, not together.
    """
    check_mode(mode)
    summary = ChunksSummary(mode=mode)
    fenced = fence_prefix is not None and mode == "atomic"
    if stream and target is not None and stream != target.name:
        raise InvalidRequestError(f"stream={stream!r} and target={target.name!r} name two streams; pass one of them",
                                  reason="invalid_request")
    name = stream if target is None else target.name
    if name and (target is None or (fenced and not target.fenced)):  # a target checked without fences: again
        target = await check_target_stream(conn, name, mode=mode, fence=fenced)
    expected = expected_last_seq if mode == "atomic" else None
    of = f"/{total_chunks}" if total_chunks else ""
    for number, chunk in enumerate(chunks, start=1):
        try:
            if target is None and fenced and chunk:
                owners = await streams_for_subject(conn, chunk[0].subject)
                if owners:
                    target = await check_target_stream(conn, owners[0], mode=mode, fence=True)
            if target is not None:
                await target.require(conn, {m.subject for m in chunk})
            result = await publish_chunk(conn, chunk, mode=mode, expected_last_seq=expected, max_msgs=max_msgs,
                                         flow=flow, batch_id=f"{batch_prefix}-{number}" if batch_prefix else None,
                                         target=target, fence_id=f"{fence_prefix}-{number}" if fenced else None)
        except JetStreamError as exc:
            if not summary.chunks:
                raise
            raise _later_chunk_failed(exc, number, of, summary) from exc
        summary.add(result)
        if expected is not None:
            expected = result.last_seq
        if log is not None and (number <= _LOG_FIRST or number % _LOG_EVERY == 0 or number == total_chunks):
            log.info("chunk %d%s: %d message(s) committed to %s, seq %s%s", number, of, result.count, result.stream,
                     _seqs(result.first_seq, result.last_seq),
                     " (already committed earlier)" if result.already_committed else "")
    if not summary.chunks:
        raise InvalidRequestError("there are no messages to publish", reason="empty_batch")
    return summary


def _later_chunk_failed(error: JetStreamError, number: int, of: str, summary: ChunksSummary) -> BatchPublishError:
    """The error of chunk ``number`` failing after the chunks before it were committed: it says what they hold. A
    fast chunk's :class:`FastBatchError` stays one, counted over the whole publish: its ``stored`` is the earlier
    chunks' messages plus the failed chunk's first ``stored`` (None when that is unknown)."""
    message = (f"chunk {number}{of} failed after chunks 1..{number - 1} were committed ({summary.count} message(s), "
               f"seqs {_seqs(summary.first_seq, summary.last_seq)}): {error.message}. With msg ids (dedupe_key, or a "
               "producer_function's automatic ids) a retry skips the committed chunks")
    if isinstance(error, FastBatchError):
        stored = None if error.stored is None else summary.count + error.stored
        return FastBatchError(message, stored=stored, total=summary.count + error.total,
                              stream=error.stream or summary.stream, reason=error.reason, code=error.code,
                              err_code=error.err_code, description=error.description)
    return BatchPublishError(message, reason=error.reason, code=error.code, err_code=error.err_code,
                             description=error.description)


def _seqs(first: int | None, last: int | None) -> str:
    """``1..3``; ``..3`` for fast batches, whose first sequence the server does not report."""
    return f"{'' if first is None else first}..{last}"
