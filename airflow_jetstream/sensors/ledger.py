"""JetStreamBatchLedgerSensor: wait until every batch of a run reached a state in the batch ledger."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowException

from airflow_jetstream.client.ledger.counts import check_waitable_state
from airflow_jetstream.client.ledger.records import CONSUMED, DEFAULT_BUCKET
from airflow_jetstream.sensors.base import JetStreamStateSensor
from airflow_jetstream.triggers.ledger import JetStreamBatchLedgerTrigger


class JetStreamBatchLedgerSensor(JetStreamStateSensor):
    """Wait until at least ``min_batches`` batches of ``run_id`` exist in the batch ledger and all of
    them reached ``state`` (``published`` < ``in_progress`` < ``consumed``).

    Each poke reads the run's counts: one request, whatever the number of batches. A batch in ``failed``
    (a dead letter: its consume attempts ran out) fails the task at once with the failed batches and their
    last errors, since waiting cannot fix it; ``fail_on_failed=False`` waits on instead (until the batches
    are requeued or the sensor times out). With ``reap_expired`` every poke also returns batches whose claim
    expired (a consumer that died) to ``published``, or to ``failed`` past their max attempts. Deferred, the
    trigger waits for the run's counts to change (one shared subscription per triggerer process), checking
    the same condition (:class:`~airflow_jetstream.client.ledger.wait.LedgerWait`). Returns the run's ledger
    summary (``{"batches", "states", "messages", "attempts", "failed", ...}``)::

        consumed = JetStreamBatchLedgerSensor(
            task_id="all_batches_consumed",
            run_id="{{ run_id }}",          # the default: batches recorded by this DAG run
            state="consumed",
            min_batches="{{ ti.xcom_pull(task_ids='produce')['batches'] }}",
            reap_expired=True,
            deferrable=True, poke_interval=10, timeout=3600,
        )
        produce >> consume >> consumed >> report

    :param run_id: the run whose batches to wait for (templated; default ``{{ run_id }}``).
    :param state: ``published``, ``in_progress`` or ``consumed`` (templated; default ``consumed``).
    :param ledger_bucket: the ledger's KV bucket (templated; default ``batch_ledger``).
    :param min_batches: wait until at least this many batches are recorded (templated; default 1).
    :param reap_expired: reap expired claims on every poke.
    :param fail_on_failed: fail as soon as a batch is ``failed`` (default True).
    :param deferrable: wait in the triggerer (``JetStreamBatchLedgerTrigger``); default
        ``[operators] default_deferrable``.
    :param nats_conn_id: the ``nats`` connection to use.
    """

    template_fields: Sequence[str] = ("run_id", "state", "ledger_bucket", "min_batches", "nats_conn_id")
    what = "batch ledger"

    def __init__(self, *, run_id: str = "{{ run_id }}", state: str = CONSUMED, ledger_bucket: str = DEFAULT_BUCKET,
                 min_batches: int | str = 1, reap_expired: bool = False, fail_on_failed: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if "{{" not in state:
            check_waitable_state(state)
        self.run_id = run_id
        self.state = state
        self.ledger_bucket = ledger_bucket
        self.min_batches = min_batches
        self.reap_expired = reap_expired
        self.fail_on_failed = fail_on_failed

    def _min_batches(self) -> int:
        try:
            value = int(self.min_batches)
        except (TypeError, ValueError):
            raise AirflowException(f"min_batches must be an integer, got {self.min_batches!r}") from None
        if value < 0:
            raise AirflowException(f"min_batches must be >= 0, got {value}")
        return value

    def trigger(self) -> JetStreamBatchLedgerTrigger:
        return JetStreamBatchLedgerTrigger(
            run_id=self.run_id, state=self.state, ledger_bucket=self.ledger_bucket, min_batches=self._min_batches(),
            reap_expired=self.reap_expired, fail_on_failed=self.fail_on_failed,
            nats_conn_id=self.nats_conn_id, poll_interval=self.poke_interval,
        )
