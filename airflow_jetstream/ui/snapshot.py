"""One read of a ``nats`` connection for the JetStream view: async, bounded, creating nothing on the server.

Streams are listed first; consumers, the ledger and the advisory window are then read side by side, and
sources are built from what was read (ui/overview.py, no consumer, no write). Everything
ends by ``ViewSettings.timeout``: a connection that cannot be opened, or a stream listing that does not
come back by then (server down, stalled, unreachable), is the snapshot's ``error``; a later section
that fails or runs out of time carries its own typed error and the others still show. Then
:func:`~airflow_jetstream.ui.problems.find_problems` adds ``problems``, worst first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_jetstream.client.connection import JetStreamConnection, connect
from airflow_jetstream.client.errors import InvalidSubjectError, JetStreamError, RequestTimeoutError
from airflow_jetstream.client.kv.names import stream_of
from airflow_jetstream.client.natspy_internals import server_info
from airflow_jetstream.client.server_features import server_version
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.client.subjects import validate_name
from airflow_jetstream.ui import overview
from airflow_jetstream.ui.config import ViewSettings
from airflow_jetstream.ui.problems import Observations, find_problems

#: Connections being closed after a read (a close can wait on a stalled server; nobody waits for it).
_CLOSING: set[asyncio.Task[None]] = set()


@dataclass(frozen=True)
class ReadKey:
    """What one read covers; equal keys share a read (and its cached result)."""

    connection_id: str
    ledger_bucket: str
    capture_stream: str
    run_id: str | None = None
    ledger_before: int | None = None

    def check(self) -> None:
        """Refuse a bucket or stream name nats-server would refuse, naming the rule (:class:`InvalidRequestError`)."""
        validate_name(stream_of(self.ledger_bucket), what="the ledger bucket's stream")
        validate_name(self.capture_stream, what="capture stream")
        if self.run_id is not None and not (0 < len(self.run_id) <= 256):
            raise InvalidSubjectError("run_id must be 1 to 256 characters", reason="invalid_id")


def view_connection_settings(own: ConnectionSettings, view: ViewSettings) -> ConnectionSettings:
    """The connection's settings with the view's bounds: requests capped at ``request_timeout``, connects fitting
    the page's ``timeout`` across the listed servers, and no waiting for leader elections (shown as errors)."""
    per_server = max(0.5, (view.timeout - 1.0) / max(1, len(own.servers)))
    return own.with_overrides(connect_timeout=min(own.connect_timeout, view.request_timeout, per_server),
                              request_timeout=min(own.request_timeout, view.request_timeout), leader_wait=0)


def _timed_out(view: ViewSettings, what: str) -> dict[str, Any]:
    return {"error": RequestTimeoutError(f"{what}: no answer within the view's {view.timeout:g}s "
                                         "([jetstream] view_timeout)", reason="view_timeout").to_dict()}


async def _section(name: str, read: Any, out: dict[str, Any], view: ViewSettings) -> None:
    try:
        out[name] = await read
    except JetStreamError as exc:
        out[name] = {"error": exc.to_dict()}
    except TimeoutError:
        out[name] = _timed_out(view, name)


async def _collect(conn: JetStreamConnection, key: ReadKey, view: ViewSettings, deadline: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    out: dict[str, Any] = {}
    async with asyncio.timeout_at(deadline):
        listed = await overview.list_streams(conn, limit=view.max_streams)
    infos = listed.pop("infos")
    out["streams"] = listed

    reads = {"consumers": overview.consumers_of(conn, listed["streams"], limit=view.max_consumers),
             "ledger": overview.ledger_runs(conn, key.ledger_bucket, limit=view.ledger_entries,
                                            before_seq=key.ledger_before, run_id=key.run_id),
             "advisories": overview.recent_advisories(conn, key.capture_stream, limit=view.advisories)}
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(deadline - loop.time(), 0)):
            await asyncio.gather(*(_section(name, read, out, view) for name, read in reads.items()))
    for name in reads:
        out.setdefault(name, _timed_out(view, name))
    rows = (out["consumers"] or {}).get("consumers") or []
    out["sources"] = {"sources": overview.source_rows(infos, rows)}
    return out


def _close_later(conn: JetStreamConnection, timeout: float) -> None:
    async def close() -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await conn.close()

    task = asyncio.ensure_future(close())
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)


async def read_snapshot(key: ReadKey, own: ConnectionSettings, view: ViewSettings, seen: Observations, *,
                        deadline: float, watchers: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the view shows for ``key`` (JSON-able, no secret), ended by ``deadline`` (loop time); with the
    connection's event ``watchers`` (ui/app.py, event_watchers) those waiting for a missing stream are problems.

    A connection that cannot be opened, or streams that cannot be listed, give ``{"error": ...}`` with the
    typed error and no sections.
    """
    started = time.monotonic()
    result: dict[str, Any] = {"connection_id": key.connection_id, "servers": list(own.servers),
                              "ledger_bucket": key.ledger_bucket, "capture_stream": key.capture_stream,
                              "run_id": key.run_id, "ledger_before": key.ledger_before,
                              "read_at": datetime.now(UTC).isoformat(), "watchers": watchers}
    settings = view_connection_settings(own, view)
    conn: JetStreamConnection | None = None
    try:
        async with asyncio.timeout_at(deadline):
            conn = await connect(settings)
        version = server_version(conn)
        result["server"] = {"version": ".".join(map(str, version)) if version else None,
                            "cluster": server_info(conn.nc).get("cluster")}
        result.update(await _collect(conn, key, view, deadline))
    except JetStreamError as exc:
        result["error"] = exc.to_dict()
    except TimeoutError:
        result["error"] = _timed_out(view, f"reading {', '.join(settings.servers)}")["error"]
    finally:
        if conn is not None:
            _close_later(conn, settings.request_timeout)
    if "error" not in result:
        result["problems"] = find_problems(result, view.thresholds, seen)
    result["elapsed_ms"] = round((time.monotonic() - started) * 1000)
    return result
