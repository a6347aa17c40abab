"""JetStreamBatchLedgerSensor: wait until every batch of a run reached a state in the batch ledger."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_jetstream.client.ledger.counts import check_waitable_state
from airflow_jetstream.client.ledger.records import CONSUMED, DEFAULT_BUCKET
from airflow_jetstream.sensors.base import JetStreamStateSensor
from airflow_jetstream.triggers.ledger import JetStreamBatchLedgerTrigger


class JetStreamBatchLedgerSensor(JetStreamStateSensor):
    """Wait until at least ``min_batches`` batches of ``run_id`` exist in the batch ledger and all reached
    ``state`` (``published`` < ``in_progress`` < ``consumed``).

    Each poke reads the run's counts: one request, whatever the number of batches. A ``failed`` batch (a dead
    letter) fails the task at once, since waiting cannot fix it (``fail_on_failed=False`` waits on);
    ``reap_expired`` returns batches whose claim expired to ``published`` on every poke. Deferred, the trigger
    waits for the run's counts to change, checking the same condition
    (:class:`~airflow_jetstream.client.ledger.wait.LedgerWait`). Returns the run's ledger summary; see
    docs/sensors/ledger.md.
    """

    template_fields: Sequence[str] = ("run_id", "state", "ledger_bucket", "min_batches")
    trigger_class = JetStreamBatchLedgerTrigger

    def __init__(self, *, run_id: str = "{{ run_id }}", state: str = CONSUMED, ledger_bucket: str = DEFAULT_BUCKET,
                 min_batches: int | str = 1, reap_expired: bool = False, fail_on_failed: bool = True,
                 **kwargs: Any) -> None:
        if "{{" not in state:
            check_waitable_state(state)
        self.run_id = run_id
        self.state = state
        self.ledger_bucket = ledger_bucket
        self.min_batches = min_batches
        self.reap_expired = reap_expired
        self.fail_on_failed = fail_on_failed
        super().__init__(**kwargs)  # after the parameters: with start_from_trigger it builds the trigger
