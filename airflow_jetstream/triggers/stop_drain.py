"""A clean triggerer stop that acks what Airflow already stored before the triggerer lets go.

Airflow's trigger runner confirms that an event was stored one state sync (about a second) after
it stored it, and stops syncing as soon as SIGTERM/SIGINT arrives: events stored in that last
second were never confirmed, so their messages were returned to the server and came again after a
restart (duplicates). While a shared JetStream stream is open in the trigger runner's main thread,
the first SIGTERM/SIGINT is held back for at most ``DRAIN_SECONDS``: the producers stop handing out
new messages, the runner keeps syncing, the confirmations arrive and the messages are acked; then
Airflow's own handler runs and the runner stops as before. Whatever is still unconfirmed then was
not stored and goes back to the server (nak) when the stream closes.

A second signal during the drain is remembered and delivered with the first one. SIGKILL cannot
be held back: a crash between storing an event and its ack still repeats that message (see
docs/event-driven.md).

Replacing a process's signal handlers depends on how Airflow's trigger runner installs its own, so
the hook is used only on the Airflow releases it was measured on (``TESTED_AIRFLOW``: 0 lost,
0 doubled on SIGTERM in tests/test_airflow_deployment.py). On any other release it stays out of the
way, with one warning per process: a stop is then plain Airflow's (events stored in its last second
may come again after a restart).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: At most this long a clean stop waits for the last confirmations (Airflow escalates after 10 s).
DRAIN_SECONDS = 5.0
#: The Airflow releases whose trigger runner the hook was measured against (update with the constraints pin,
#: after the deployment test passed on the new release; a test holds the pin to this set).
TESTED_AIRFLOW = frozenset({(3, 3, 2)})
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Drainable(Protocol):
    def pause(self) -> None: ...  # hand out no new messages

    def unsettled(self) -> int: ...  # handed out, neither acked nor given back yet


class _StopDrain:
    """The process-wide signal hook shared by every open producer of the trigger runner."""

    def __init__(self, tested: frozenset[tuple[int, int, int]] = TESTED_AIRFLOW) -> None:
        self.tested = tested
        self.enabled: bool | None = None  # decided at the first register()
        self.producers: set[Drainable] = set()
        self.previous: dict[int, Any] = {}
        self.pending: list[int] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None

    def register(self, producer: Drainable) -> bool:
        """Hook the stop signals (main thread of a running loop, tested Airflow only); False when not hooked."""
        if not self._on_tested_airflow() or threading.current_thread() is not threading.main_thread():
            return False
        if not self.previous:
            self.loop = asyncio.get_running_loop()
            for sig in _SIGNALS:
                self.previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._on_signal)
        self.producers.add(producer)
        return True

    def _on_tested_airflow(self) -> bool:
        if self.enabled is None:
            from airflow_jetstream.airflow_compat import airflow_version

            installed = airflow_version()
            self.enabled = installed in self.tested
            if not self.enabled:
                log.warning("Clean-stop hook not used: it is tested on Airflow %s, this is Airflow %s. A triggerer "
                            "stop is Airflow's own: events stored in its last second may come again after a restart",
                            ", ".join(".".join(map(str, v)) for v in sorted(self.tested)),
                            ".".join(map(str, installed)))
        return self.enabled

    def unregister(self, producer: Drainable) -> None:
        self.producers.discard(producer)
        if not self.producers and self.task is None:
            self._restore()

    def _restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.pending.append(signum)
        if self.task is None and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        started = time.monotonic()
        producers = list(self.producers)
        for producer in producers:
            producer.pause()
        before = sum(p.unsettled() for p in producers)
        deadline = started + DRAIN_SECONDS
        while time.monotonic() < deadline and any(p.unsettled() for p in producers):
            await asyncio.sleep(0.05)  # waiting for Airflow's next state sync; bounded by DRAIN_SECONDS
        left = sum(p.unsettled() for p in producers)
        log.info("Clean stop: %d of %d delivered message(s) acked after Airflow confirmed their events in %.1f s; "
                 "%d unconfirmed go back to the server", before - left, before, time.monotonic() - started, left)
        previous, pending = dict(self.previous), list(self.pending)
        self._restore()
        for signum in dict.fromkeys(pending):
            _deliver(previous.get(signum, signal.SIG_DFL), signum)


def _deliver(handler: Callable[[int, Any], Any] | int | None, signum: int) -> None:
    """Run the handler that was installed before ours, as the signal would have."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


STOP_DRAIN = _StopDrain()
