"""How long the server leaves one delivery of an explicit-ack consumer to us, as a local deadline.

The server redelivers a message whose delivery was neither acked nor kept "in progress" within the
consumer's ``ack_wait``. A reader that was stalled (a stopped process, a long pause) past that point
no longer holds the delivery: another reader may have it, and acting on it again repeats it.
:class:`DeliveryLease` keeps a conservative deadline on the local monotonic clock, never later than
the server's:

* it starts at the time the pull request was sent (the server delivered no sooner),
* an in-progress signal (``+WPI``) moves it to the time the signal was sent plus ``ack_wait``, but
  only when the server confirmed the signal before the old deadline (a signal that arrives later
  extends whoever holds the message now, not us).

A lease past its deadline is expired: do not act on the message, nor ack, nak or term it; the server
has redelivered it or will.
"""

from __future__ import annotations

import time
from typing import Any

import nats.errors


class DeliveryLease:
    """One delivery's local deadline. ``since``: when its pull request was sent (``time.monotonic()``)."""

    __slots__ = ("ack_wait", "deadline", "dropped", "msg", "since")

    def __init__(self, msg: Any, *, ack_wait: float, since: float) -> None:
        self.msg = msg
        self.ack_wait = ack_wait
        self.since = since
        self.deadline = since + ack_wait
        self.dropped = False  # not acted on because it expired: leave it to the server

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def held_for(self) -> float:
        """Seconds since the delivery's pull request was sent."""
        return time.monotonic() - self.since

    async def extend(self, nc: Any, timeout: float) -> bool:
        """Send ``+WPI`` on ``nc`` (the connection it came on) and wait for the server's confirmation; True
        when the lease was extended."""
        if self.expired():
            return False
        sent = time.monotonic()
        try:
            await nc.request(self.msg.reply, b"+WPI", timeout=timeout)
        except (nats.errors.Error, OSError):
            return False
        if time.monotonic() >= self.deadline:  # confirmed too late: the server may have redelivered meanwhile
            return False
        self.deadline = sent + self.ack_wait
        return True
