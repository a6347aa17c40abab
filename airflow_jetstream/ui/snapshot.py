"""One read of a ``nats`` connection for the JetStream view: its bounds, the read itself, and its sharing.

The bounds come from Airflow's ``[jetstream]`` section (declared in get_provider_info's ``config``), read on
every request (Airflow caches its config), so a change takes effect without a restart of the view's code; a
value that is not a number or a duration is refused with a typed error naming the option.

A read is async, bounded, and creates nothing on the server. Streams are listed first; consumers, the ledger
and the advisory window are then read side by side, and sources are built from what was read (ui/overview.py,
no consumer, no write). Everything ends by ``ViewSettings.timeout``: a connection that cannot be opened, or a
stream listing that does not come back by then (server down, stalled, unreachable), is the snapshot's
``error``; a later section that fails or runs out of time carries its own typed error and the others still
show. Then :func:`~airflow_jetstream.ui.problems.find_problems` adds ``problems``, worst first.

During an incident many people open the same page at once. :class:`ReadCache` gives every request with the
same :class:`ReadKey` the same read: the one in flight, or the finished one while it is younger than
``cache_seconds``. Reads of one connection with different keys (another ledger bucket, an older ledger page)
run at most ``concurrent_reads`` at once; a read waiting for its turn counts against its deadline. A request
that gives up waiting leaves the read running for the others (it ends by its own deadline). Everything runs
on the api-server's event loop: no thread is held while NATS answers, so a stalled NATS ties up no worker
thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from functools import partial
from typing import Any

from airflow.providers.common.compat.sdk import conf

from airflow_jetstream.client.connection import JetStreamConnection, connect
from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    InvalidSettingsError,
    InvalidSubjectError,
    JetStreamError,
    RequestTimeoutError,
)
from airflow_jetstream.client.kv.names import stream_of
from airflow_jetstream.client.natspy_internals import server_info
from airflow_jetstream.client.server_features import server_version
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.client.subjects import validate_name
from airflow_jetstream.get_provider_info import CONFIG_SECTION
from airflow_jetstream.ui import overview
from airflow_jetstream.ui.problems import Observations, Thresholds, find_problems

SECTION = "jetstream"


@dataclass(frozen=True)
class ViewSettings:
    """Bounds of one read and of the page, and the problem thresholds."""

    cache_seconds: float = 5.0
    concurrent_reads: int = 2
    timeout: float = 10.0
    request_timeout: float = 5.0
    page_size: int = 50
    max_streams: int = 1000
    max_consumers: int = 5000
    ledger_entries: int = 5000
    advisories: int = 1000
    thresholds: Thresholds = field(default_factory=Thresholds)


#: Options that must be at least 1 (the other numbers at least 0).
AT_LEAST_ONE = frozenset({"view_concurrent_reads", "view_page_size", "view_max_streams", "view_ledger_entries",
                          "problem_redelivered"})


def _option(option: str) -> Any:
    """``[jetstream] option`` (its declared default when unset), of its declared type: a float or an integer (at
    least 1 or 0, :data:`AT_LEAST_ONE`), or a duration (type string: seconds, or a string like '90s')."""
    declared = CONFIG_SECTION["options"][option]
    text = str(conf.get(SECTION, option, fallback=declared["default"]))
    if declared["type"] == "string":
        try:
            return float(to_seconds(text, field=f"[{SECTION}] {option}"))
        except JetStreamError as exc:
            raise InvalidSettingsError(exc.message, reason="invalid_setting") from None
    minimum = 1 if option in AT_LEAST_ONE else 0
    try:
        value = (int if declared["type"] == "integer" else float)(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise InvalidSettingsError(f"[{SECTION}] {option} = {text!r} must be a number >= {minimum}",
                                   reason="invalid_setting")
    return value


def view_settings() -> ViewSettings:
    """The ``[jetstream]`` options as :class:`ViewSettings` (defaults for those not set): each field's option is
    ``view_<field>``, each threshold's ``problem_<field>``."""
    thresholds = Thresholds(**{f.name: _option(f"problem_{f.name}") for f in fields(Thresholds)})
    return ViewSettings(**{f.name: _option(f"view_{f.name}") for f in fields(ViewSettings) if f.name != "thresholds"},
                        thresholds=thresholds)


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
    # The view's bounds: requests capped at ``request_timeout``, connects fitting the page's ``timeout`` across the
    # listed servers, and no waiting for leader elections (shown as errors).
    per_server = max(0.5, (view.timeout - 1.0) / max(1, len(own.servers)))
    settings = own.with_overrides(connect_timeout=min(own.connect_timeout, view.request_timeout, per_server),
                                  request_timeout=min(own.request_timeout, view.request_timeout), leader_wait=0)
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


#: Finished reads kept (the least recently used beyond this are dropped).
MAX_ENTRIES = 256

Reader = Callable[[float, Observations], Awaitable[dict[str, Any]]]


@dataclass
class _Entry:
    task: asyncio.Task[dict[str, Any]]
    finished: float | None = None


def _finished(entry: _Entry, loop: asyncio.AbstractEventLoop, _: object) -> None:
    entry.finished = loop.time()


@dataclass
class ReadCache:
    """Single-flight reads with a short time to live, per event loop."""

    entries: OrderedDict[ReadKey, _Entry] = field(default_factory=OrderedDict)
    gates: dict[str, asyncio.Semaphore] = field(default_factory=dict)
    observations: dict[str, Observations] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None
    #: Reads started (not answered from the cache); tests and the performance page count them.
    reads_started: int = 0

    async def get(self, key: ReadKey, read: Reader, *, ttl: float, concurrent: int,
                  timeout: float) -> tuple[dict[str, Any], float]:
        """The result of ``read(deadline, observations)`` for ``key`` and its age in seconds (0 for a new read).

        Raises what the read raised (a cached failure too, while fresh); TimeoutError when nothing came within
        ``timeout`` seconds (the read goes on for the others).
        """
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # tasks and semaphores belong to one loop (a test client may bring another)
            self.entries.clear()
            self.gates.clear()
            self.loop = loop
        entry = self.entries.get(key)
        if entry is not None and (entry.finished is None or loop.time() - entry.finished < ttl):
            self.entries.move_to_end(key)
        else:
            gate = self.gates.setdefault(key.connection_id, asyncio.Semaphore(concurrent))
            seen = self.observations.setdefault(key.connection_id, Observations())
            entry = _Entry(loop.create_task(self._run(gate, read, seen, loop.time() + timeout)))
            self.entries[key] = entry
            self.reads_started += 1
            entry.task.add_done_callback(partial(_finished, entry, loop))
            while len(self.entries) > MAX_ENTRIES:
                self.entries.popitem(last=False)
        async with asyncio.timeout(timeout):
            result = await asyncio.shield(entry.task)
        age = loop.time() - entry.finished if entry.finished is not None else 0.0
        return result, age

    @staticmethod
    async def _run(gate: asyncio.Semaphore, read: Reader, seen: Observations, deadline: float) -> dict[str, Any]:
        async with asyncio.timeout_at(deadline):
            await gate.acquire()
        try:
            if asyncio.get_running_loop().time() >= deadline:  # its turn came with its time up: no read at all
                raise TimeoutError
            return await read(deadline, seen)
        finally:
            gate.release()
