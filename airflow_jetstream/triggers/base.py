"""What the provider's triggers share: one implementation of each wait condition, and the retry policy.

A :class:`JetStreamWaitTrigger` is a wait condition with the sensor's parameters. :meth:`~JetStreamWaitTrigger.check`
looks once (it is what the sensor's poke runs, through the hook), :meth:`~JetStreamWaitTrigger.wait` waits until
the condition holds (what the triggerer runs); both return the same event, so the sensor handles a poke's result
and a trigger's event alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import weakref
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import (
    AuthenticationError,
    ConnectionFailedError,
    JetStreamError,
    LeaderUnavailableError,
    RequestTimeoutError,
    TLSConfigurationError,
)
from airflow_jetstream.client.retry import Backoff, retry
from airflow_jetstream.hooks.jetstream import JetStreamHook

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

#: Errors a busy or restarting server causes (e.g. hundreds of triggers starting at once, a leader election), after
#: which ``wait`` is attempted again (from the start: each wait picks up where the server is).
TRANSIENT_ERRORS = (RequestTimeoutError, ConnectionFailedError)
PERMANENT_ERRORS = (AuthenticationError, TLSConfigurationError)
#: The triggers' one policy: a transient error is retried up to ``TRANSIENT_RETRIES`` times, 1 s doubling up to 30 s.
TRANSIENT_RETRIES = 5
TRIGGER_BACKOFF = Backoff(1.0, 30.0)
#: Each pause between polls is drawn from this share of ``poll_interval`` around it, so that triggers started
#: together (a triggerer restart) do not keep polling in the same instant.
POLL_JITTER = 0.1
#: Polling triggers of one process asking for the same state (the same consumer, source or ledger run) share a
#: reply at most this many seconds old, and one request in flight.
SHARED_STATUS_AGE = 1.0
_statuses: weakref.WeakKeyDictionary[Any, dict[str, tuple[float, asyncio.Future[dict[str, Any]]]]] = (
    weakref.WeakKeyDictionary())


class JetStreamWaitTrigger(BaseTrigger):
    """A wait condition, implemented once for the sensor's poke and the triggerer.

    Subclasses implement :meth:`check` (one look now: the event when the condition holds, else None; it sets
    ``last_seen`` to one line saying what it saw) and :meth:`wait` (until the condition holds), and
    name their own arguments in ``serialized``. ``run`` waits on the loop's shared connection, retries
    transient errors (:meth:`_wait`) and ends at ``timeout_at`` (ISO time) with
    ``{"status": "timeout", "description": <last seen>}``.
    """

    what = "condition"
    #: True when ``wait`` ends at ``timeout_at`` itself (after a last look), instead of being cut off there.
    checks_deadline = False
    #: The attributes ``serialize`` stores (as the keyword arguments of the same names), besides the bases'
    #: (``common``: not part of what a condition waits for, so not of the state polling triggers share).
    serialized: tuple[str, ...] = ()
    common: tuple[str, ...] = ("nats_conn_id", "timeout_at")

    def __init__(self, *, nats_conn_id: str = JetStreamHook.default_conn_name, timeout_at: str | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow's BaseTrigger is not annotated
        self.nats_conn_id = nats_conn_id
        self.timeout_at = timeout_at
        self.last_seen = "nothing (no look finished)"

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {name: getattr(self, name) for name in (*self.serialized, *self.common)})

    def remaining(self) -> float | None:
        """Seconds until ``timeout_at`` (negative once past), None without one."""
        if self.timeout_at is None:
            return None
        return (datetime.fromisoformat(self.timeout_at) - datetime.now(UTC)).total_seconds()

    async def check(self, conn: JetStreamConnection) -> dict[str, Any] | None:
        """One look: the event when the condition holds now, else None (``last_seen`` says what was seen)."""
        raise NotImplementedError

    async def wait(self, conn: JetStreamConnection) -> dict[str, Any]:
        """The event once the condition holds."""
        raise NotImplementedError

    def goal(self) -> str:
        """What is waited for, as one line."""
        return self.what

    def look_line(self, done: bool) -> str:
        """What the last look saw, as the one log line of a poke ("" when the result's own line says it)."""
        return self.last_seen[:1].upper() + self.last_seen[1:]

    def timeout_event(self) -> dict[str, Any]:
        return {"status": "timeout", "description": self.last_seen}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # ``airflow dags test`` runs a deferred task's trigger inline and ignores the deferral timeout, so a sensor
        # whose condition never came true waited forever: the trigger ends at ``timeout_at`` itself. The event is
        # yielded after the connection is released: a generator closed right after its first event (as ``airflow
        # dags test`` runs triggers) has nothing left to clean up.
        remaining = None if self.checks_deadline else self.remaining()
        if remaining is None:
            event = await self._wait()
        else:
            try:
                event = await asyncio.wait_for(self._wait(), max(remaining, 0.0))
            except TimeoutError:
                event = self.timeout_event()
        yield TriggerEvent(event)

    async def _wait(self) -> dict[str, Any]:
        """``wait`` with the client's retry rule (:func:`~airflow_jetstream.client.retry.retry`): one of
        ``TRANSIENT_ERRORS`` (a leader election included) is retried up to ``TRANSIENT_RETRIES`` times, 1 s doubling
        up to 30 s; any other error, or the last one, is the event ``{"status": "error", "error": {...}}``. Each attempt
        borrows the loop's pooled connection, so a retry after a lost connection gets a new one."""
        what, log = f"Waiting for {self.goal()}", cast(logging.Logger, self.log)  # Airflow's logger: the same methods

        def why(exc: JetStreamError) -> str | None:
            if isinstance(exc, PERMANENT_ERRORS) or not isinstance(exc, TRANSIENT_ERRORS):
                return None
            return "the cluster is electing a leader" if isinstance(exc, LeaderUnavailableError) else "interrupted"

        try:
            return await retry(what, self._attempt, transient=why, budget=None, budget_name="retries",
                               max_retries=TRANSIENT_RETRIES, backoff=TRIGGER_BACKOFF, logger=log)
        except JetStreamError as exc:
            self.log.error("%s failed: %s", what, exc)
            return {"status": "error", "error": exc.to_dict()}

    async def _attempt(self) -> dict[str, Any]:
        from airflow_jetstream.client.connection_pool import shared_connection

        settings = await JetStreamHook(nats_conn_id=self.nats_conn_id).aget_settings()
        async with shared_connection(settings) as conn:
            return await self.wait(conn)


class JetStreamResultTrigger(JetStreamWaitTrigger):
    """A wait whose success is the sensor's result (the state and KV sensors' conditions).

    ``end_from_trigger=True``: when the condition holds, the trigger stores the result as the task's XCom
    ``return_value`` and ends the task as success (``TaskSuccessEvent``), logging the sensor's ``Done: ...`` line;
    no worker runs. An error or a timeout stays a plain event: a worker's ``execute_complete`` fails (or skips) the
    task as without the flag. A trigger run for no task instance (``airflow dags test`` runs it inline and would
    hand the task only the event's state) yields the plain event too, and so does one whose XCom could not be
    stored (a worker's ``execute_complete`` then stores it).

    The XCom goes through the triggerer's Execution API, as a worker's does, not in the event's ``xcoms``: Airflow
    3.2 and 3.3 store those JSON-encoded once more (``XComModel.set`` with ``serialize=True`` into the JSON column),
    so a downstream task would read a string instead of the dict (seen in tests/test_airflow_deployment.py).
    """

    common = (*JetStreamWaitTrigger.common, "end_from_trigger")

    def __init__(self, *, end_from_trigger: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.end_from_trigger = bool(end_from_trigger)

    def result(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The sensor's XCom value for ``event`` when it is a success, else None."""
        raise NotImplementedError

    def done_line(self, result: dict[str, Any]) -> str:
        """The one log line of a success (the sensor's, or the triggerer's when it ends the task)."""
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for event in super().run():
            result = self.result(event.payload) if self.end_from_trigger else None
            if result is None or getattr(self, "task_instance", None) is None or not await self._store(result):
                yield event
                continue
            self.log.info("%s", self.done_line(result))
            yield TaskSuccessEvent()

    async def _store(self, result: dict[str, Any]) -> bool:
        """Store ``result`` as the task's XCom ``return_value`` through the triggerer's supervisor (the configured
        XCom backend, then the Execution API); False, logged, when that failed."""
        from airflow.sdk.execution_time.xcom import XCom

        ti: Any = self.task_instance  # the triggerer's: a runtime task instance or the workload's
        where = {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id, "map_index": ti.map_index}
        try:
            if hasattr(XCom, "aset"):  # the task SDK of Airflow 3.3
                await XCom.aset(key="return_value", value=result, **where)
            else:  # Airflow 3.2's triggerer answers the sync call made from a thread
                from asgiref.sync import sync_to_async

                await sync_to_async(XCom.set)(key="return_value", value=result, **where)
        except Exception as exc:  # any failure: the task resumes on a worker, whose execute_complete stores it
            self.log.warning("Could not store the result as the task's XCom (%s: %s): a worker ends the task",
                             type(exc).__name__, exc)
            return False
        return True


class JetStreamPollingTrigger(JetStreamResultTrigger):
    """A condition read as a state: ``status()`` every ``poll_interval`` seconds (staggered) until ``done_when`` holds.

    Events: ``{"status": "success", "result": {...}}``, ``{"status": "error", "error": {...}}`` or, once
    ``timeout_at`` passed, ``{"status": "timeout", "last": {...}, "description": "<last state>"}`` (after one
    more look, so that the last state is a fresh one).
    """

    checks_deadline = True
    common = (*JetStreamResultTrigger.common, "poll_interval")
    done_when: str  # the status's field that is true once the condition holds
    _logged_at = float("-inf")

    def __init__(self, *, poll_interval: float | str | timedelta = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poll_interval = to_seconds(poll_interval, field="poll_interval")
        self.last_status: dict[str, Any] | None = None

    def describe(self, status: dict[str, Any]) -> str:
        """The state as one human line."""
        return str(status)

    def result(self, event: dict[str, Any]) -> dict[str, Any] | None:
        return event["result"] if event.get("status") == "success" else None

    def done_line(self, result: dict[str, Any]) -> str:
        return f"Done: {self.describe(result)}"

    def look_line(self, done: bool) -> str:
        return "" if done else f"Not yet: {self.last_seen}"  # done: the sensor logs "Done: ..." with the result

    async def status(self, conn: JetStreamConnection) -> dict[str, Any]:
        raise NotImplementedError

    async def shared_status(self, conn: JetStreamConnection) -> dict[str, Any]:
        """``status()``, shared with the polling triggers of this connection that ask for the same state: one
        request in flight, and a reply reused for ``SHARED_STATUS_AGE`` seconds."""
        state = json.dumps({name: getattr(self, name) for name in self.serialized}, sort_keys=True, default=str)
        key = f"{type(self).__module__}.{type(self).__qualname__}:{state}"
        cache = _statuses.setdefault(conn, {})
        now = asyncio.get_running_loop().time()
        asked = cache.get(key)
        if asked is None or (asked[1].done() and now - asked[0] > SHARED_STATUS_AGE):
            if len(cache) > 256:  # forget the replies nobody can reuse any more
                for old in [k for k, (at, f) in cache.items() if f.done() and now - at > SHARED_STATUS_AGE]:
                    del cache[old]
            future: asyncio.Future[dict[str, Any]] = asyncio.ensure_future(self.status(conn))
            asked = cache[key] = (now, future)

            def forget_failure(done: asyncio.Future[dict[str, Any]]) -> None:
                if (done.cancelled() or done.exception() is not None) and cache.get(key, (0, None))[1] is done:
                    del cache[key]  # a failure is not reused: the next poll asks again

            future.add_done_callback(forget_failure)
        return dict(await asyncio.shield(asked[1]))

    async def check(self, conn: JetStreamConnection) -> dict[str, Any] | None:
        return self.verdict(await self.shared_status(conn))

    def verdict(self, status: dict[str, Any]) -> dict[str, Any] | None:
        """The event ``status`` calls for (its error, or success once done), else None; ``last_seen`` describes it."""
        self.last_status = status
        if status.get("error") and isinstance(status["error"], dict):
            return {"status": "error", "error": {**status["error"], "state": status}}
        self.last_seen = self.describe(status)
        return {"status": "success", "result": status} if status[self.done_when] else None

    def next_event(self, status: dict[str, Any]) -> dict[str, Any] | None:
        """The event for ``status`` (:meth:`verdict`'s, or the timeout once ``timeout_at`` passed), else None after
        logging what was seen (a line per poll; an event-driven wait's changes can come faster: not more often)."""
        event = self.verdict(status)
        remaining = self.remaining()
        if event is None and remaining is not None and remaining <= 0:
            event = self.timeout_event()
        if event is None and time.monotonic() - self._logged_at >= self.poll_interval * (1 - POLL_JITTER):
            self._logged_at = time.monotonic()
            self.log.info("Waiting for %s: %s", self.what, self.last_seen)
        return event

    async def wait(self, conn: JetStreamConnection) -> dict[str, Any]:
        while (event := self.next_event(await self.shared_status(conn))) is None:
            await asyncio.sleep(self.poll_interval * random.uniform(1 - POLL_JITTER, 1 + POLL_JITTER))
        return event

    def timeout_event(self) -> dict[str, Any]:
        return {**super().timeout_event(), "last": self.last_status}
