"""Every use of a nats-py private attribute, in one place; docs/compatibility.md ("nats-py internals") says why
nats-py's public API does not do each, and what upstream would need to make it public.

- ``_send_command`` / ``_flush_pending``: batches written as one buffer of encoded frames (``nc.publish`` per
  message costs more Python time than the server needs to store it, docs/performance.md);
- ``_parse_header_lines`` (per connection): keep every value of a repeated header name;
- ``_process_pong`` / ``_pongs`` (per connection): a late PONG for a timed-out flush ends nats-py 2.16's read loop;
- ``_server_info`` (read only): the ``cluster`` name in the server's INFO.

The package metadata caps nats-py below the next minor the suite has not run; beyond that, :func:`check_natspy`
probes each use on the installed nats-py when the first connection opens (``_server_info`` once it is open:
:func:`check_connected`) and refuses with :class:`NatsPyVersionError` naming the version and what changed, instead of
running on moved internals.

JetStream API calls go through ``JetStreamConnection.api_request`` (raw ``$JS.API`` JSON), not nats-py's
``JetStreamManager``: one error vocabulary (typed errors, leader-election retries, permission violations at
once) and the server's JSON kept whole; the manager's ``purge_stream`` does not report ``purged``, ``get_msg``
has no ``start_time``, and its dataclasses drop fields nats-py does not model (the guard test pins each reason).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any

import nats.aio.client
from nats.aio.client import DEFAULT_PENDING_SIZE, Client
from nats.protocol.parser import Parser

from airflow_jetstream.client.errors import ConnectionFailedError, NatsPyVersionError

#: The nats-py releases the suite ran against (the package metadata allows these minors only).
SUPPORTED_NATSPY = ">=2.15.0,<2.17"

#: The private attributes of ``nats.aio.client.Client`` used here (:func:`check_natspy` probes each).
CLIENT_ATTRIBUTES = ("_send_command", "_flush_pending", "_parse_header_lines", "_process_pong", "_pongs",
                     "_pongs_received", "_pings_outstanding", "_server_info")

#: nats-py's own header parser (the class's static method; a connection's may be replaced).
natspy_parse_header_lines: Callable[[bytes], dict[str, str]] = Client._parse_header_lines

#: The ``pending_size`` each connection was opened with (nats-py keeps it privately).
_pending_limits: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def natspy_header_pairs(raw: bytes) -> list[tuple[str, str]]:
    """Every ``(name, value)`` of a header block as nats-py's own parser reads each line, in order."""
    return [pair for line in raw.split(b"\r\n") if line for pair in natspy_parse_header_lines(line).items()]


def install_header_parser(nc: Any, parser: Callable[[bytes], dict[str, str]]) -> None:
    """Make ``nc`` parse headers with ``parser`` (:func:`~airflow_jetstream.client.reading.headers.parse_header_lines`,
    passed in by the caller: that module builds on this one)."""
    if getattr(type(nc), "_parse_header_lines", None) is not None:
        nc._parse_header_lines = parser


def install_pong_guard(nc: Any) -> None:
    """Make a late PONG for a timed-out ``nc.flush(timeout=...)`` harmless instead of ending ``nc``'s read loop."""

    async def process_pong() -> None:
        if nc._pongs:
            future = nc._pongs.pop(0)  # each PONG answers the oldest PING, also one whose flush gave up
            if not future.done():
                future.set_result(True)
            nc._pongs_received += 1
            nc._pings_outstanding = 0

    nc._process_pong = process_pong


def with_pending_size(nc: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for ``nc.connect`` with ``pending_size`` set (nats-py's default unless given), remembered
    for :func:`write_raw`'s check while reconnecting."""
    options = {**options, "pending_size": options.get("pending_size", DEFAULT_PENDING_SIZE)}
    _pending_limits[nc] = options["pending_size"]
    return options


def server_info(nc: Any) -> dict[str, Any]:
    """The INFO the connected server sent (``{}`` before the connection is open)."""
    info = getattr(nc, "_server_info", None)
    return info if isinstance(info, dict) else {}


async def write_raw(nc: Any, frames: bytes) -> None:
    """Queue already-encoded protocol frames on the connection and kick its flusher.

    Uses nats-py's outgoing buffer, so frames written while the client reconnects are sent after
    the reconnect like any publish; as for ``nc.publish``, frames that would overflow that buffer
    while reconnecting are refused.
    """
    if nc.is_closed:
        raise ConnectionFailedError("the NATS connection is closed", reason="connection_lost")
    if nc.is_draining_pubs:
        raise ConnectionFailedError("the NATS connection is draining", reason="connection_lost")
    limit = _pending_limits.get(nc, DEFAULT_PENDING_SIZE)
    if not nc.is_connected and nc.pending_data_size + len(frames) > limit:
        raise ConnectionFailedError(
            "the NATS connection is reconnecting and its outgoing buffer is full", reason="connection_lost"
        )
    await nc._send_command(frames)
    await nc._flush_pending()


# -- the guard: each use probed on the installed nats-py -------------------------------------------------


def _coroutine(name: str, *params: str) -> str | None:
    member = getattr(Client, name, None)
    if member is None:
        return f"Client.{name} is gone"
    if not inspect.iscoroutinefunction(member):
        return f"Client.{name} is no longer a coroutine function"
    names = list(inspect.signature(member).parameters)[1:]
    if names[:len(params)] != list(params):
        return f"Client.{name} now takes ({', '.join(names)}), not ({', '.join(params)})"
    return None


async def _probe_raw_write() -> str | None:
    """Frames given to ``_send_command`` land in the outgoing buffer that ``pending_data_size`` counts."""
    problem = _coroutine("_send_command", "cmd") or _coroutine("_flush_pending")
    if problem:
        return problem
    client = Client()
    await client._send_command(b"PING\r\n")
    if client.pending_data_size != len(b"PING\r\n"):
        return "Client._send_command no longer queues frames in the buffer pending_data_size counts"
    return None


async def _probe_header_parser() -> str | None:
    """``_process_headers`` still parses header lines with the connection's ``_parse_header_lines``."""
    if not isinstance(inspect.getattr_static(Client, "_parse_header_lines", None), staticmethod):
        return "Client._parse_header_lines is no longer a static method"
    seen: list[bytes] = []

    def parser(raw: bytes) -> dict[str, str]:
        seen.append(raw)
        return {"X-Probe": "parsed here"}

    client = Client()
    client._parse_header_lines = parser  # type: ignore[method-assign]
    parsed = await client._process_headers(b"NATS/1.0\r\nX-Probe: 1\r\nX-Probe: 2\r\n\r\n")
    if not seen or dict(parsed or {}) != {"X-Probe": "parsed here"}:
        why = " (fast-mail-parser is installed, and nats-py parses with it then: uninstall it)" if getattr(
            nats.aio.client, "parse_email", None) else ""
        return f"Client._process_headers does not parse header lines with the connection's _parse_header_lines{why}"
    return None


async def _probe_pong() -> str | None:
    """A PONG from the server reaches the connection's ``_process_pong``, and PINGs wait in ``_pongs``."""
    problem = _coroutine("_process_pong")
    if problem:
        return problem
    client = Client()
    kinds = {name: type(getattr(client, name, None)).__name__ for name in ("_pongs", "_pongs_received",
                                                                            "_pings_outstanding")}
    if kinds != {"_pongs": "list", "_pongs_received": "int", "_pings_outstanding": "int"}:
        return f"Client's PONG bookkeeping changed ({kinds})"
    answered: list[bool] = []

    class Reader:  # stands in for the connection: any other callback the parser makes does nothing
        async def _process_pong(self) -> None:
            answered.append(True)

        def __getattr__(self, name: str) -> Callable[..., Awaitable[None]]:
            async def ignored(*args: Any, **kwargs: Any) -> None:
                return None

            return ignored

    await Parser(Reader()).parse(b"PONG\r\n")
    if not answered:
        return "nats-py's protocol parser no longer answers a PONG with the connection's _process_pong"
    return None


#: (what the toolkit uses it for, the probe) per private use, in the order docs/compatibility.md lists them; the
#: last, ``_server_info``, holds the server's INFO only once connected: :func:`check_connected` checks it then.
PROBES: tuple[tuple[str, Callable[[], Awaitable[str | None]]], ...] = (
    ("raw batch writes (_send_command, _flush_pending)", _probe_raw_write),
    ("repeated header names (_parse_header_lines)", _probe_header_parser),
    ("the late-PONG guard (_process_pong, _pongs)", _probe_pong),
)

_checked: list[NatsPyVersionError | None] = []


async def check_natspy() -> None:
    """Probe every private use on the installed nats-py (once per process); raise :class:`NatsPyVersionError`
    naming the nats-py version and each change found."""
    if not _checked:
        problems = []
        for use, probe in PROBES:
            try:
                problem = await probe()
            except Exception as exc:  # a probe that breaks is a change too, named by what broke
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                problems.append(f"{use}: {problem}")
        _checked.append(_refusal(problems) if problems else None)
    if _checked[0] is not None:
        raise _checked[0]


def _refusal(problems: list[str]) -> NatsPyVersionError:
    return NatsPyVersionError(
        f"nats-py {metadata.version('nats-py')} changed what airflow-jetstream relies on: {'; '.join(problems)}. "
        f"This airflow-jetstream runs on nats-py {SUPPORTED_NATSPY}: pip install \"nats-py{SUPPORTED_NATSPY}\" "
        "(docs/compatibility.md, \"nats-py internals\", says what it uses and why)")


def check_connected(nc: Any) -> None:
    """After connecting: the server's INFO is where :func:`server_info` reads it."""
    if not server_info(nc).get("server_id"):
        raise _refusal(["cluster detection (_server_info): the connected client's _server_info holds no server INFO"])
