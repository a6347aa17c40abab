"""The foreground of ``make up`` and ``make up-hosts``: restart each component that exits until Ctrl-C or SIGTERM.

Both deployments install :class:`StopRequest` before they start anything (a Ctrl-C during the start then stops
them cleanly instead of killing the process half-way), then :func:`serve`: start, restart what exits, stop.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType


class StopRequest:
    """Set by SIGINT or SIGTERM once made: the deployment stops at :func:`supervise`'s next turn, at once."""

    def __init__(self) -> None:
        self._event = threading.Event()
        signal.signal(signal.SIGTERM, self._request)
        signal.signal(signal.SIGINT, self._request)

    def _request(self, signum: int, frame: FrameType | None) -> None:
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a stop request (a signal ends the wait); returns whether one came."""
        return self._event.wait(seconds)


def supervise(stop: StopRequest, restart_exited: Callable[[], object], *, every: float = 1.0) -> None:
    """Call ``restart_exited`` every ``every`` seconds until ``stop`` is requested (it prints what it restarts)."""
    while not stop.requested:
        restart_exited()
        stop.wait(every)


def serve(stop: StopRequest, name: str, *, start: Callable[[], str], restart_exited: Callable[[], object],
          stopping: str, close: Callable[[], object], errors: tuple[type[Exception], ...]) -> int:
    """``start`` (it returns the banner to print), then :func:`supervise` until ``stop``; then print ``stopping`` and
    ``close`` whatever happened. Returns 0, or 1 after one of ``errors`` (printed as ``<name> FAILED: ...``)."""
    try:
        print(start(), flush=True)
        supervise(stop, restart_exited)
    except errors as exc:
        print(f"{name} FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        print(stopping, flush=True)
        close()
    return 0
