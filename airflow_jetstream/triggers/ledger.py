"""JetStreamBatchLedgerTrigger: wait, event-driven, until all batches of a run reached a state in the batch ledger."""

from __future__ import annotations

import asyncio
import random
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.ledger.counts import shards_of
from airflow_jetstream.client.ledger.records import CONSUMED, DEFAULT_BUCKET, Entry, counts_pattern, epoch_of
from airflow_jetstream.client.ledger.wait import LedgerWait
from airflow_jetstream.triggers.base import JetStreamPollingTrigger

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection
    from airflow_jetstream.client.reading.shared_tail import TailListener

def describe_progress(status: dict[str, Any]) -> str:
    """``run 'R': 7/10 batch(es) reached consumed (at least 1 expected; published 2, ...)``."""
    states = ", ".join(f"{name} {count}" for name, count in (status.get("states") or {}).items())
    line = (f"run {status.get('run_id')!r}: {status.get('reached')}/{status.get('batches')} batch(es) reached "
            f"{status.get('awaited')} (at least {status.get('min_batches')} expected; {states})")
    reaped = status.get("reaped") or {}
    if reaped.get("returned") or reaped.get("failed"):
        line += f"; reaped expired claims: returned {reaped.get('returned')}, failed {reaped.get('failed')}"
    return line


#: Seconds between checks that do not wait for an event (a run recorded before the ledger kept counts,
#: a bucket that does not exist yet) are drawn from 0.8-1.2x ``poll_interval``: polls of many triggers spread out.
JITTER = (0.8, 1.2)


class JetStreamBatchLedgerTrigger(JetStreamPollingTrigger):
    """Fire when at least ``min_batches`` batches of ``run_id`` exist and all reached ``state``.

    Waits for the run's counts to change rather than polling: the triggers of a process on one ledger bucket
    share one subscription to its counts subjects, and a change is evaluated from the message itself. The check
    is :class:`~airflow_jetstream.client.ledger.wait.LedgerWait`'s, as the sensor's poke. With ``reap_expired``
    it also wakes when a claim may have expired. A run recorded before the ledger kept counts, or a missing
    bucket, is polled every ``poll_interval`` instead. Events: ``success`` with the ledger summary, or ``error``
    (``batches_failed`` with the failed batches, or the ledger could not be read).
    """

    what = "batch ledger"
    done_when = "done"
    serialized = ("run_id", "state", "ledger_bucket", "min_batches", "reap_expired", "fail_on_failed")

    def __init__(self, *, run_id: str, state: str = CONSUMED, ledger_bucket: str = DEFAULT_BUCKET,
                 min_batches: int | str = 1, reap_expired: bool = False, fail_on_failed: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id
        self.state = state
        self.ledger_bucket = ledger_bucket
        self.min_batches = min_batches
        self.reap_expired = reap_expired
        self.fail_on_failed = fail_on_failed

    @cached_property
    def condition(self) -> LedgerWait:
        """The check, shared with the sensor's poke (through :meth:`check`). Built on first use, inside the wait's
        error handling: started from the triggerer, the fields are templates until the triggerer renders them."""
        try:
            count = int(self.min_batches)  # a rendered template is a string
        except (TypeError, ValueError):
            raise InvalidRequestError(f"min_batches must be an integer >= 0, got {self.min_batches!r}",
                                      reason="invalid_option") from None
        return LedgerWait(run_id=self.run_id, state=self.state, bucket=self.ledger_bucket, min_batches=count,
                          reap=bool(self.reap_expired), fail_on_failed=bool(self.fail_on_failed))

    async def status(self, conn: JetStreamConnection) -> dict[str, Any]:
        return await self.condition.check(conn)

    describe = staticmethod(describe_progress)

    async def wait(self, conn: JetStreamConnection) -> dict[str, Any]:
        from airflow_jetstream.client.errors import StreamNotFoundError
        from airflow_jetstream.client.reading.shared_tail import follow

        while True:
            try:
                async with follow(conn, self.condition.stream, self.condition.counts_subjects,
                                  tail_filter=self.condition.all_counts_subjects) as listener:
                    return await self._follow(conn, listener)
            except StreamNotFoundError:
                event = self.next_event(await self.status(conn))  # no bucket yet: a run without batches
                if event is not None:
                    return event
                await asyncio.sleep(self._pause(None))

    async def _follow(self, conn: JetStreamConnection, listener: TailListener) -> dict[str, Any]:
        async with listener.catching_up():  # what was stored until the listener joined, a bounded few at once
            status, shards, seqs = await self._look(conn)
        while True:
            event = self.next_event(status)
            if event is not None:
                return event
            try:
                messages = await asyncio.wait_for(listener.next_batch(), self._pause(status))
            except TimeoutError:
                messages = []
            if not messages or status.get("counted_by") != "counts":
                # a claim may have expired, a listed run got its counts, or the safety look: read it all again
                status, shards, seqs = await self._look(conn)
                continue
            for message in messages:
                shard = int(message.subject.rsplit(".", 1)[1])
                if message.seq <= seqs.get(shard, 0):
                    continue  # already in what was read
                seqs[shard] = message.seq
                entry = Entry(key=message.subject, seq=message.seq, data=message.data,
                              deleted=bool(message.headers.get("KV-Operation")))
                shards.pop(shard, None)
                shards.update(shards_of({message.subject: entry}))
            status = self.condition.status_of_counts(shards)

    async def _look(self, conn: JetStreamConnection) -> tuple[dict[str, Any], dict[int, dict[str, Any]],
                                                              dict[int, int]]:
        """The status (the check, reaping when asked), and the run's counts shards with their sequences as of now
        (at or after the listener's ``since``: the listener brings every change after it)."""
        from airflow_jetstream.client.ledger.store import read_last

        status = await self.status(conn)
        if status.get("counted_by") != "counts" or not status["batches"]:
            return status, {}, {}
        entries = await read_last(conn, self.condition.bucket, [counts_pattern(self.condition.run_id)])
        return status, shards_of(entries), {int(k.rsplit(".", 1)[1]): e.seq for k, e in entries.items()}

    def _pause(self, status: dict[str, Any] | None) -> float:
        """Seconds to wait for a change before looking again without one."""
        jittered = self.poll_interval * random.uniform(*JITTER)
        if status is None or status.get("counted_by") != "counts":
            pause = jittered
        else:
            pause = max(jittered, 300.0)  # events tell of every change; this is only a safety look
            if self.condition.reap and status.get("next_deadline"):
                pause = min(pause, max(0.5, epoch_of(status["next_deadline"]) - time.time() + 0.5))
        left = self.remaining()
        return pause if left is None else min(pause, max(0.0, left) + 0.1)
