"""Every use of a nats-py private attribute, in one place, each with why nats-py's public API does not do.

nats-py (2.16) may rename or drop any of these in a release; ``tests/test_natspy_internals.py``
checks each one exists and behaves as used here, so an upgrade fails there first, by name.

- ``Client._send_command`` / ``Client._flush_pending``: queue already-encoded protocol frames and
  kick the flusher. The batch publishers write a whole batch as one buffer; ``nc.publish`` per
  message costs more Python time than the server needs to store it (docs/performance.md), and
  nats-py has no public raw-write call.
- ``Client._pending_data_size`` / ``Client._max_pending_size``: while reconnecting, refuse frames
  that would overflow nats-py's outgoing buffer (what ``nc.publish`` checks internally) with a
  typed error instead of growing it without bound.
- ``Client._parse_header_lines`` (a static method, per connection overridable): nats-py keeps one
  value per header name; other clients (nats.js ``append``, Go ``Header.Add``) send repeated names
  (``X-Multi: a`` + ``X-Multi: b``). The toolkit's connections parse headers with
  :func:`~airflow_jetstream.client.reading.headers.parse_header_lines`, which calls this same nats-py
  parser and returns its dict unchanged, adding only ``repeated``: nats-py's KV and JetStream code on
  those connections reads exactly what it reads on any other (tests/test_header_parser.py), at the
  same speed (one extra count of the block's lines).
- ``Client._process_pong`` / ``Client._pongs`` (per connection): nats-py 2.16 cancels the future of a
  ``flush(timeout=...)`` that timed out but leaves it in its queue of PINGs awaiting a PONG; when the
  late PONG comes (a stalled server resumes), setting its result raises ``InvalidStateError``, which
  ends nats-py's read loop while the connection still says "connected": nothing is read again and
  nothing reconnects. The replacement answers the oldest PING as before and skips a future that is
  already done.

JetStream API calls go through :meth:`JetStreamConnection.api_request
<airflow_jetstream.client.connection.JetStreamConnection.api_request>` (raw ``$JS.API`` JSON), not
nats-py's ``JetStreamManager``, for one error vocabulary: typed errors with the server's codes,
bounded retries while a clustered stream elects a leader, a permission violation reported at once,
and the server's JSON kept whole (nats-py's dataclasses drop fields they do not know). Where the
manager has a call, it also does less than needed (the guard test pins each reason):

- ``purge_stream`` returns only ``success``; purges here report how many messages went (``purged``).
- ``get_msg`` cannot ask for the first message at or after a time (``start_time``), which
  consumer resets by time need.
- ``consumer_info`` / ``pause_consumer`` / ``reset_consumer`` return dataclasses without the fields
  nats-py does not model (``reset_seq`` comes back, but e.g. priority-group state does not);
  reset also needs the lookup first, as the server never answers a reset of an unknown consumer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nats.aio.client import Client

from airflow_jetstream.client.errors import ConnectionFailedError

#: The private attributes of ``nats.aio.client.Client`` used here (the guard test checks each).
CLIENT_ATTRIBUTES = ("_send_command", "_flush_pending", "_pending_data_size", "_max_pending_size",
                     "_parse_header_lines", "_process_pong", "_pongs", "_pongs_received", "_pings_outstanding")


#: nats-py's own header parser (the class's static method; a connection's may be replaced).
natspy_parse_header_lines: Callable[[bytes], dict[str, str]] = Client._parse_header_lines


def natspy_header_pairs(raw: bytes) -> list[tuple[str, str]]:
    """Every ``(name, value)`` of a header block as nats-py's own parser reads each line, in order."""
    return [pair for line in raw.split(b"\r\n") if line for pair in natspy_parse_header_lines(line).items()]


def install_header_parser(nc: Any) -> None:
    """Make ``nc`` parse headers with :func:`~airflow_jetstream.client.reading.headers.parse_header_lines`."""
    from airflow_jetstream.client.reading.headers import parse_header_lines  # it builds on this module

    if getattr(type(nc), "_parse_header_lines", None) is not None:
        nc._parse_header_lines = parse_header_lines


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


async def write_raw(nc: Any, frames: bytes) -> None:
    """Queue already-encoded protocol frames on the connection and kick its flusher.

    Uses nats-py's outgoing buffer, so frames written while the client reconnects are sent after
    the reconnect like any publish.
    """
    if nc.is_closed:
        raise ConnectionFailedError("the NATS connection is closed", reason="connection_lost")
    if nc.is_draining_pubs:
        raise ConnectionFailedError("the NATS connection is draining", reason="connection_lost")
    if not nc.is_connected and nc._pending_data_size + len(frames) > nc._max_pending_size:
        raise ConnectionFailedError(
            "the NATS connection is reconnecting and its outgoing buffer is full", reason="connection_lost"
        )
    await nc._send_command(frames)
    await nc._flush_pending()
