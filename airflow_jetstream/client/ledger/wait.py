"""Waiting for a run: the one check the ledger sensor's poke and its trigger share.

Imported when a DAG file is parsed (the trigger and sensor modules import it), so it imports no nats-py: the
reads (:mod:`~airflow_jetstream.client.ledger.store`) and the reaper (:mod:`~.batch_ledger`) load when a check
runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.errors import BatchesFailedError, InvalidRequestError
from airflow_jetstream.client.kv.names import stream_of
from airflow_jetstream.client.ledger.counts import check_waitable_state, count_reached, due_shards, merged, run_reached
from airflow_jetstream.client.ledger.records import CONSUMED, COUNTS_TOKEN, DEFAULT_BUCKET, check_id, counts_pattern

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

_NOTHING_REAPED: dict[str, Any] = {"returned": [], "failed": [], "returned_count": 0, "failed_count": 0}


@dataclass(frozen=True)
class LedgerWait:
    """Wait until at least ``min_batches`` batches of ``run_id`` exist and all reached ``state``: the one check
    the ledger sensor's poke and its trigger share (:meth:`BatchLedger.wait_all` applies the same rule,
    :func:`~airflow_jetstream.client.ledger.counts.run_reached`, with its ledger's clock).

    :meth:`check` looks once (the run's counts: one request, whatever its size) and returns the status dict
    sensors log and return, with ``done`` and, when batches failed, ``error``.
    """

    run_id: str
    state: str = CONSUMED
    bucket: str = DEFAULT_BUCKET
    min_batches: int = 1
    reap: bool = False
    fail_on_failed: bool = True

    def __post_init__(self) -> None:
        check_id(self.run_id, "run_id")
        check_waitable_state(self.state)
        if isinstance(self.min_batches, bool) or not isinstance(self.min_batches, int) or self.min_batches < 0:
            raise InvalidRequestError(f"min_batches must be an integer >= 0, got {self.min_batches!r}",
                                      reason="invalid_option")

    @property
    def stream(self) -> str:
        """The ledger bucket's stream."""
        return stream_of(self.bucket)

    @property
    def counts_subjects(self) -> str:
        """The subjects (a filter) of the run's counts: every change of the run is a message here."""
        return f"$KV.{self.bucket}.{counts_pattern(self.run_id)}"

    @property
    def all_counts_subjects(self) -> str:
        """The counts subjects of every run of the bucket (what one shared subscription per process follows)."""
        return f"$KV.{self.bucket}.*.{COUNTS_TOKEN}.*"

    async def check(self, conn: JetStreamConnection) -> dict[str, Any]:
        """One look at the run: its summary plus ``awaited``, ``reached``, ``min_batches``, ``reaped``, ``done``
        and, when batches failed (and ``fail_on_failed``), ``error``. A missing bucket is a run without batches.
        Only with ``reap`` does it write (expired claims)."""
        from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
        from airflow_jetstream.client.ledger.store import read_counts, run_summary

        reaped = _NOTHING_REAPED
        if self.reap:
            shards = await read_counts(conn, self.bucket, self.run_id)
            if shards and not due_shards(shards, time.time()):
                return self.status_of_counts(shards)  # no claim can have expired: the counts are the look
            result = await BatchLedger(conn, self.bucket).reap(self.run_id)  # no bucket: nothing reaped
            reaped = {**result, **{outcome: [item["batch_id"] for item in result[outcome]]
                                   for outcome in ("returned", "failed")}}
        summary = await run_summary(conn, self.bucket, self.run_id, time.time())
        return self.status(summary, reaped)

    def status_of_counts(self, shards: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
        """The status from the run's counts shards as the caller holds them (e.g. from the run's counts messages)."""
        return self.status(merged(self.run_id, self.bucket, shards, time.time()))

    def status(self, summary: dict[str, Any], reaped: dict[str, Any] = _NOTHING_REAPED) -> dict[str, Any]:
        """The status of a run's summary (what :meth:`check` returns)."""
        status = {**summary, "awaited": self.state, "reached": count_reached(summary, self.state),
                  "min_batches": self.min_batches, "reaped": reaped}
        try:
            status["done"] = run_reached(summary, self.state, min_batches=self.min_batches,
                                         fail_on_failed=self.fail_on_failed)
        except BatchesFailedError as exc:
            status["done"] = False
            status["error"] = exc.to_dict()
        return status
