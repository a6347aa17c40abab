"""One read-only snapshot of a ``nats`` connection for the JetStream view, with fixed bounds and a deadline.

Sections (streams, consumers, sources, ledger, advisories) are read one after the other through
:class:`JetStreamHook` and client/admin/overview; a section that fails carries its typed error
(``reason``, ``message``) and the others still show. Once the deadline passes the remaining
sections say so instead of waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from airflow_jetstream.client.admin import overview
from airflow_jetstream.client.advisories import DEFAULT_CAPTURE_STREAM
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import JetStreamError, RequestTimeoutError
from airflow_jetstream.client.ledger import DEFAULT_BUCKET
from airflow_jetstream.client.subjects import validate_name
from airflow_jetstream.hooks.connection_settings import ConnectionNotFoundError
from airflow_jetstream.hooks.jetstream import JetStreamHook


@dataclass(frozen=True)
class ViewLimits:
    """The most one request reads: rows per section, seconds per NATS request and for the whole page."""

    streams: int = overview.MAX_STREAMS
    consumers: int = 200
    consumers_per_stream: int = overview.MAX_CONSUMERS
    sources: int = overview.MAX_SOURCES
    ledger_keys: int = overview.MAX_LEDGER_KEYS
    advisories: int = overview.MAX_ADVISORIES
    request_timeout: float = 5.0
    deadline: float = 20.0


def check_names(ledger_bucket: str, capture_stream: str) -> None:
    """Refuse names that are not stream/bucket names (typed :class:`InvalidSubjectError`)."""
    validate_name(ledger_bucket, what="ledger bucket")
    validate_name(capture_stream, what="capture stream")


async def _consumers(conn: JetStreamConnection, streams: list[dict[str, Any]], limits: ViewLimits) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    total = 0
    for stream in streams:
        if not stream["consumer_count"]:
            continue
        total += stream["consumer_count"]
        room = min(limits.consumers - len(rows), limits.consumers_per_stream)
        if room > 0:
            rows.extend((await overview.list_consumer_rows(conn, stream["name"], limit=room))["consumers"])
    return {"consumers": rows, "total": total, "truncated": total > len(rows)}


async def _collect(conn: JetStreamConnection, ledger_bucket: str, capture_stream: str,
                   limits: ViewLimits) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.deadline
    out: dict[str, Any] = {}

    async def section(name: str, read: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        left = deadline - loop.time()
        if left <= 0:
            out[name] = {"error": RequestTimeoutError(
                f"not read: the page's {limits.deadline:g}s deadline passed", reason="view_deadline").to_dict()}
            return
        try:
            out[name] = await asyncio.wait_for(read(), left)
        except JetStreamError as exc:
            out[name] = {"error": exc.to_dict()}
        except TimeoutError:
            out[name] = {"error": RequestTimeoutError(
                f"stopped at the page's {limits.deadline:g}s deadline", reason="view_deadline").to_dict()}

    await section("streams", lambda: overview.list_streams(conn, limit=limits.streams))
    infos = out["streams"].pop("infos", [])
    streams = out["streams"].get("streams", [])
    await section("consumers", lambda: _consumers(conn, streams, limits))
    await section("sources", lambda: overview.source_rows(conn, infos, limit=limits.sources))
    await section("ledger", lambda: overview.ledger_runs(conn, ledger_bucket, limit=limits.ledger_keys))
    await section("advisories", lambda: overview.recent_advisories(conn, capture_stream, limit=limits.advisories))
    return out


def read_snapshot(connection_id: str, *, ledger_bucket: str = DEFAULT_BUCKET,
                  capture_stream: str = DEFAULT_CAPTURE_STREAM, limits: ViewLimits | None = None) -> dict[str, Any]:
    """Everything the view shows for ``connection_id``: JSON-able, without any secret.

    NATS requests get the connection's own timeouts capped at ``limits.request_timeout`` and no
    waiting for leader elections (a missing leader shows as the section's error).

    A connection that cannot be opened gives ``{"error": ...}`` with the typed error and no sections.
    """
    limits = limits or ViewLimits()
    check_names(ledger_bucket, capture_stream)
    started = time.monotonic()
    result: dict[str, Any] = {"connection_id": connection_id, "ledger_bucket": ledger_bucket,
                              "capture_stream": capture_stream, "limits": asdict(limits)}
    try:
        own = JetStreamHook(nats_conn_id=connection_id).settings
        result["servers"] = list(own.servers)
        hook = JetStreamHook(nats_conn_id=connection_id, leader_wait=0,
                             connect_timeout=min(own.connect_timeout, limits.request_timeout),
                             request_timeout=min(own.request_timeout, limits.request_timeout))
        result.update(hook.run(_collect, ledger_bucket, capture_stream, limits))
    except ConnectionNotFoundError:
        raise  # an AirflowNotFoundException: the app answers 404
    except JetStreamError as exc:
        result["error"] = exc.to_dict()
    result["elapsed_ms"] = round((time.monotonic() - started) * 1000)
    return result
