"""JetStreamBatchLedgerTrigger: poll the batch ledger until all batches of a run reached a state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_jetstream.client.ledger.records import CONSUMED, DEFAULT_BUCKET
from airflow_jetstream.client.ledger.summary import check_waitable_state
from airflow_jetstream.triggers.base import JetStreamPollingTrigger
from airflow_jetstream.triggers.describe import describe_progress

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection


class JetStreamBatchLedgerTrigger(JetStreamPollingTrigger):
    """Fire when at least ``min_batches`` batches of ``run_id`` exist and all reached ``state``.

    Events: ``{"status": "success", "result": <ledger summary>}``, or ``{"status": "error", "error":
    {...}}`` when batches went to ``failed`` (``reason: batches_failed``, with the failed batches)
    or the ledger could not be read. With ``reap_expired`` every poll returns expired claims to
    ``published`` (or ``failed`` past their max attempts), as the ledger's reaper does.
    """

    what = "batch ledger"

    def __init__(self, *, run_id: str, state: str = CONSUMED, bucket: str = DEFAULT_BUCKET, min_batches: int = 1,
                 reap_expired: bool = False, fail_on_failed: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id
        self.state = check_waitable_state(state)
        self.bucket = bucket
        self.min_batches = int(min_batches)
        self.reap_expired = bool(reap_expired)
        self.fail_on_failed = bool(fail_on_failed)

    def _kwargs(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "state": self.state, "bucket": self.bucket, "min_batches": self.min_batches,
                "reap_expired": self.reap_expired, "fail_on_failed": self.fail_on_failed}

    async def status(self, conn: JetStreamConnection) -> dict[str, Any]:
        from airflow_jetstream.client.ledger.batch_ledger import ledger_status

        return await ledger_status(conn, self.run_id, self.state, bucket=self.bucket, min_batches=self.min_batches,
                                   reap=self.reap_expired, fail_on_failed=self.fail_on_failed)

    def is_done(self, status: dict[str, Any]) -> bool:
        return bool(status["done"])

    def describe(self, status: dict[str, Any]) -> str:
        return describe_progress(status)
