"""A durable pull consumer on an own inbox: :class:`PullSubscription`, for long-running readers.

nats-py's ``fetch`` does the same job with two gaps that matter to long-running readers (triggerer tasks): it waits
with ``asyncio.wait_for``, which on Python 3.11 swallows a cancellation that lands while a message arrives (the task
then fetches forever), and messages of a request still in flight when the caller stops stay unseen until the
consumer's ``ack_wait`` passes. :class:`PullSubscription` waits with ``asyncio.timeout`` and its
:meth:`~PullSubscription.close` hands what still arrives for the open request to ``leftover`` (e.g. ``nak``).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from airflow_jetstream.client.batches.types import HEADER_STATUS
from airflow_jetstream.client.connection import JetStreamConnection
from airflow_jetstream.client.errors import (
    ConsumerConfigError,
    ConsumerNotFoundError,
)

_DESCRIPTION = "Description"
#: Statuses that end a pull request normally: it expired (408) or found nothing (404).
_REQUEST_ENDED = frozenset({"404", "408"})
#: Share of ``expires`` by which each pull request waits less, drawn at random (spreads the expiries).
EXPIRES_JITTER = 0.1
#: Seconds to wait before the next pull request after the server refused one for a passing reason.
_PAUSE_AFTER_REFUSAL = 1.0


class PullSubscription:
    """Pull requests of ``batch`` messages that wait up to ``expires`` seconds on the server."""

    def __init__(self, conn: JetStreamConnection, stream: str, consumer: str, *, batch: int,
                 expires: float) -> None:
        self.conn = conn
        self.stream = stream
        self.consumer = consumer
        self.batch = max(1, int(batch))
        self.expires = max(float(expires), 0.1)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._sub: Any = None
        self._inbox = ""
        self._open = False  # a pull request the server may still answer
        self._received = 0  # messages of the open request so far
        self._unreturned: list[Any] = []  # taken by a next_messages() that was cancelled: close() hands them on
        self._request_deadline = 0.0
        self._pause_until = 0.0
        #: When the latest pull request was sent (``time.monotonic()``): no message it brings was delivered
        #: earlier, so a delivery's ``ack_wait`` on the server ends no sooner than this plus ``ack_wait``.
        self.request_sent_at = 0.0

    async def start(self) -> None:
        self._inbox = self.conn.nc.new_inbox()
        self._sub = await self.conn.nc.subscribe(self._inbox, cb=self._on_message)

    async def _on_message(self, msg: Any) -> None:
        self._queue.put_nowait(msg)

    async def _request(self) -> None:
        loop = asyncio.get_running_loop()
        # Open before sending: if the caller is cancelled while sending, close() still waits for the request.
        self._open, self._received = True, 0
        # The server ends the request with a status after `expires`; past this, its answer was lost (reconnect).
        self._request_deadline = loop.time() + self.expires + self.conn.settings.request_timeout
        self.request_sent_at = time.monotonic()
        # each request waits 90-100% of `expires`: readers that started together do not all renew at once
        body = {"batch": self.batch, "expires": int(self.expires * random.uniform(1 - EXPIRES_JITTER, 1) * 1e9)}
        try:
            await self.conn.nc.publish(f"{self.conn.api_prefix}.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}",
                                       json.dumps(body).encode(), reply=self._inbox)
        except Exception:
            self._open = False
            raise

    def _take(self, msg: Any, out: list[Any]) -> None:
        """File one delivery: a message goes to ``out``; a status may end the open request."""
        status = (msg.headers or {}).get(HEADER_STATUS) if not msg.reply else None
        if status is None:
            out.append(msg)
            self._received += 1
            if self._received >= self.batch:
                self._open = False
            return
        self._open = False
        if status in _REQUEST_ENDED:
            return
        description = (msg.headers or {}).get(_DESCRIPTION, "")
        where = f"consumer {self.consumer!r} on stream {self.stream!r}"
        if status == "409" and description == "Consumer Deleted":
            raise ConsumerNotFoundError(f"{where} was deleted while it was being read; create it again")
        if status == "409" and description == "Consumer is push based":
            raise ConsumerConfigError(f"{where} is a push consumer (it has a deliver_subject); read it with a pull "
                                      "consumer", reason="not_pull_consumer")
        if status == "400" or description.startswith("Exceeded MaxRequest"):
            raise ConsumerConfigError(f"{where} refused a pull request of {self.batch} message(s) waiting "
                                      f"{self.expires}s: {status} {description}; pull fewer messages or wait "
                                      "less, or raise the consumer's max_batch / max_expires",
                                      reason="pull_request_refused")
        # Leadership change, too many waiting requests, ...: pull again, but not at once.
        self._pause_until = asyncio.get_running_loop().time() + _PAUSE_AFTER_REFUSAL

    async def next_messages(self, timeout: float, *, whole_request: bool = False) -> list[Any]:
        """Messages delivered within ``timeout`` seconds, as soon as some arrived ([] if none); ``whole_request``:
        and until the open request delivered its ``batch`` or ended (a batch is not cut where its messages arrived
        in separate reads). Messages held when cancelled go to :meth:`close`'s ``leftover``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        out: list[Any] = []
        while True:  # a cancellation while it holds messages leaves them to close()
            if not self._queue.empty():
                self._take(self._queue.get_nowait(), out)
                continue
            if (out and not (whole_request and self._open)) or loop.time() >= end:
                return out
            if not self._open:
                if loop.time() < self._pause_until:
                    await asyncio.sleep(min(end, self._pause_until) - loop.time())
                else:
                    await self._request()
                continue
            try:
                async with asyncio.timeout(min(end, self._request_deadline) - loop.time()):
                    self._take(await self._queue.get(), out)
            except TimeoutError:
                if loop.time() >= self._request_deadline:
                    self._open = False
            except asyncio.CancelledError:
                self._unreturned.extend(out)
                raise

    async def close(self, leftover: Callable[[Any], Awaitable[Any]] | None = None) -> None:
        """Unsubscribe; with ``leftover``, first wait for the open request to end (a message naked while it is open
        would come straight back to it), then pass it every delivered message not returned."""
        if self._sub is None:
            return
        held, self._unreturned = self._unreturned, []
        try:
            if leftover is not None and not self.conn.nc.is_closed:
                held += await self._until_request_ends()
        finally:
            sub, self._sub = self._sub, None
            if not self.conn.nc.is_closed:
                await sub.unsubscribe()
        if leftover is not None:
            for msg in held:
                await leftover(msg)

    async def _until_request_ends(self) -> list[Any]:
        """Every message queued or still arriving until the open request ends."""
        loop = asyncio.get_running_loop()
        held: list[Any] = []
        while True:
            try:
                if not self._queue.empty():
                    self._take(self._queue.get_nowait(), held)
                elif not self._open or loop.time() >= self._request_deadline:
                    return held
                else:
                    async with asyncio.timeout(self._request_deadline - loop.time()):
                        self._take(await self._queue.get(), held)
            except (TimeoutError, ConsumerNotFoundError, ConsumerConfigError):
                return held  # the request ended without a status, or the consumer is gone: nothing more arrives
