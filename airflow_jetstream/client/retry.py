"""The one retry rule of the client: re-run an attempt while its failure is transient, until one deadline.

The back-off loops of the provider (API requests, atomic and fast batches, the Batcher, range reads and KV
listings, worker consumer updates, the triggers) are calls of :func:`retry`. The caller says which failures are
safe to retry; the helper owns the rest, the same everywhere: doubling pauses, one deadline counted from the first
failure (the last pause cut to end at it), one log line per retry saying what, why, the pause and the time left,
and at the end the last error, its message saying how many retries over how long and naming the setting that
bounds it. Work that yields results between failures (a range read) calls :func:`retry` once per result, so the
budget counts from the first failure since the last progress.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from airflow_jetstream.client.errors import JetStreamError, LeaderUnavailableError

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Pauses between retries: ``first`` seconds, doubling up to ``most``; ``jitter`` draws each from 0.5-1x of
    that (spreading clients that failed together; ``most`` stays the longest pause)."""

    first: float = 0.25
    most: float = 2.0
    jitter: bool = False

    def pause(self, retry: int) -> float:
        """The pause before retry number ``retry`` (1-based)."""
        pause = min(self.most, self.first * 2.0 ** (retry - 1))
        return pause * random.uniform(0.5, 1.0) if self.jitter else pause


#: While a clustered stream elects a leader (5-6 s after a node dies): 0.25 s doubling up to 2 s.
ELECTION = Backoff(0.25, 2.0)


class Deadline:
    """An absolute time on the running loop's clock by which a piece of work must end."""

    def __init__(self, seconds: float) -> None:
        self.at = asyncio.get_running_loop().time() + seconds

    def left(self) -> float:
        """Seconds until the deadline (0 when passed)."""
        return max(0.0, self.at - asyncio.get_running_loop().time())


async def retry(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    transient: Callable[[JetStreamError], str | None],
    budget: float | None,
    budget_name: str = "leader_wait",
    deadline: Deadline | None = None,
    max_retries: int | None = None,
    backoff: Backoff = ELECTION,
    advice: str = "",
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = log,
    before_retry: Callable[[], Awaitable[None]] | None = None,
) -> T:
    """``await attempt()``, re-running it while it raises a :class:`JetStreamError` that ``transient`` names (it
    returns why, for the log line; None raises at once).

    ``budget`` seconds count from the first failure (None: no time limit, then ``deadline``, ``max_retries`` or
    the caller bounds it); an absolute ``deadline`` wins over it. ``budget_name`` is the setting named in the
    give-up message, ``advice`` is appended to it. ``before_retry`` is awaited before each pause (e.g. a round
    trip that proves the connection).
    """
    retries = 0
    while True:
        try:
            return await attempt()
        except JetStreamError as exc:
            why = transient(exc)
            if why is None:
                raise
            if deadline is None and budget is not None:
                deadline = Deadline(budget)
            left = deadline.left() if deadline is not None else float("inf")
            if left <= 0 or (max_retries is not None and retries >= max_retries):
                if retries:
                    if left > 0:
                        bound = f" ({budget_name}={max_retries})"
                    else:
                        bound = f" over {budget:g}s ({budget_name})" if budget is not None else " (deadline)"
                    exc.message = f"{exc.message}; still failing after {retries} retries{bound}" + (
                        f": {advice}" if advice else "")
                    exc.args = (exc.message,)
                raise
            retries += 1
            pause = min(backoff.pause(retries), left)
            logger.warning("%s: %s (%s); retry %d in %.2f s%s", what, why, exc.reason, retries, pause,
                           f", {left:.1f} s of {budget_name} left" if left != float("inf") else "")
            if before_retry is not None:
                await before_retry()
            await asyncio.sleep(pause)


def is_leader_unavailable(exc: JetStreamError) -> str | None:
    """``transient`` for waiting out a leader election: a :class:`LeaderUnavailableError` (no leader answered,
    or the leader asked to be asked again)."""
    return "leader unavailable" if isinstance(exc, LeaderUnavailableError) else None
