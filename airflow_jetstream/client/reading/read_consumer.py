"""The short-lived read consumer of :func:`~airflow_jetstream.client.reading.stored.read_range` (``via="consumer"``)
and :func:`~airflow_jetstream.client.reading.stored.read_latest_per_subject`: an ephemeral ``ack_policy: none`` pull
consumer, one in-memory replica, pulled in large batches with sequence and time read from each delivery's reply
subject (no API round trip per message). It is deleted after a complete read; the server drops one a failed read
left once inactive for 30 s."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from airflow_jetstream.client.admin.consumers import filter_config
from airflow_jetstream.client.admin.streams import stream_info
from airflow_jetstream.client.batches.types import HEADER_STATUS
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import JetStreamError, LeaderUnavailableError
from airflow_jetstream.client.reading.messages import Row

#: Pull statuses that mean "no leader right now": no responders, leadership change.
_LEADER_STATUSES = frozenset({"503", "409"})


async def check_current_host(conn: JetStreamConnection, stream: str, name: str, created: dict[str, Any]) -> None:
    """Raise :class:`LeaderUnavailableError` (after deleting consumer ``name``) unless its server is the stream
    leader or a current replica (no lag), per the leader's stream info."""
    host = (created.get("cluster") or {}).get("leader")
    if not conn.clustered or not host:
        return
    cluster = (await stream_info(conn, stream)).get("cluster") or {}
    if host == cluster.get("leader"):
        return
    replica: dict[str, Any] = next((r for r in cluster.get("replicas") or [] if r.get("name") == host), {})
    if replica.get("current") and not replica.get("lag"):
        return
    with contextlib.suppress(JetStreamError):
        await conn.api_request(f"CONSUMER.DELETE.{stream}.{name}", context="delete read consumer", retry=False)
    raise LeaderUnavailableError(f"stream {stream!r}: the read consumer was placed on {host}, a replica still "
                                 f"catching up (lag {replica.get('lag', 'unknown')})")


async def read_with_consumer(conn: JetStreamConnection, stream: str, start: dict[str, Any], last: int,
                              subjects: Sequence[str], batch: int, *,
                              current_host: bool = False) -> AsyncGenerator[list[Row], None]:
    """Read from ``start`` (a deliver policy) up to seq ``last`` or until nothing is pending; with ``current_host`` a
    consumer placed on a lagging replica is refused (:func:`check_current_host`)."""
    config: dict[str, Any] = {"name": f"read-{uuid.uuid4().hex[:16]}", **start, "ack_policy": "none", "num_replicas": 1,
                              "mem_storage": True, "inactive_threshold": 30_000_000_000, **filter_config(subjects)}
    name = config["name"]
    # Not retried here: a create that gets no answer may have been placed on a server that is down;
    # the caller's retry (``stored._resuming``) creates one under a new name, which may be placed elsewhere.
    created = await conn.api_request(f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config},
                                     context=f"read consumer on stream {stream!r}", retry=False)
    if current_host:
        await check_current_host(conn, stream, name, created)
    inbox = conn.nc.new_inbox()
    queue: asyncio.Queue[list[Row] | int] = asyncio.Queue()
    chunk: list[Row] = []
    pull = {"want": 0, "delivered": 0}

    def flush() -> None:
        queue.put_nowait(chunk.copy())
        chunk.clear()

    async def on_message(msg: Any) -> None:
        reply = msg.reply
        if not reply:
            status = msg.headers.get(HEADER_STATUS, "") if msg.headers else ""
            flush()
            queue.put_nowait(int(status or 0) or 404)
            return
        tokens = reply.rsplit(".", 5)
        seq, pending = int(tokens[2]), int(tokens[5])
        pull["delivered"] += 1
        if seq <= last:
            chunk.append((msg.subject, seq, int(tokens[4]), msg.headers, msg.data))
        if seq >= last or pending == 0:
            flush()
            queue.put_nowait(0)
        elif pull["delivered"] >= pull["want"] or len(chunk) >= batch:
            flush()

    sub = await conn.nc.subscribe(inbox, cb=on_message, pending_msgs_limit=batch * 4,
                                  pending_bytes_limit=256 * 1024 * 1024)
    next_subject = f"{conn.api_prefix}.CONSUMER.MSG.NEXT.{stream}.{name}"
    try:
        finished = False
        while not finished:
            pull["want"], pull["delivered"] = batch, 0
            await conn.nc.publish(next_subject, json.dumps({"batch": batch, "no_wait": True}).encode(),
                                  reply=inbox)
            while True:
                try:
                    async with asyncio.timeout(conn.settings.request_timeout):
                        item = await queue.get()
                except TimeoutError:
                    await conn.raise_if_denied(next_subject)
                    raise conn.unanswered(f"stream {stream!r}: no messages from the read consumer within "
                                          f"{conn.settings.request_timeout}s") from None
                if isinstance(item, list):
                    if item:
                        yield item
                    if pull["delivered"] >= pull["want"] and queue.empty():
                        break
                    continue
                if item in (0, 404, 408):
                    finished = True
                    break
                if str(item) in _LEADER_STATUSES and conn.clustered:
                    raise LeaderUnavailableError(f"stream {stream!r}: the read consumer answered status {item} "
                                                 "(no leader / leadership change)")
                raise JetStreamError(f"stream {stream!r}: the read consumer answered status {item}",
                                     reason="read_failed")
    finally:
        await sub.unsubscribe()
    # Reached only when the read completed (after an error the server drops it once inactive).
    await conn.api_request(f"CONSUMER.DELETE.{stream}.{name}", context="delete read consumer")
