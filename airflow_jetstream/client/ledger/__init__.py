"""The batch ledger: batch state in a KV bucket (``batch_ledger``).

Modules, each importing only those listed before it: ``records`` (what is stored, and the state transitions;
no I/O), ``counts`` (a run's counts and the summary merged from them; no I/O), ``store`` (the bucket on the
wire: reads, compare-and-set writes, the group commit, listings, the run summary, recounts), ``batch_ledger``
(:class:`BatchLedger`: claims, the reaper), ``wait`` (:class:`LedgerWait`, the check sensors and triggers share).

The names below are imported on first use, so reading states and records imports no nats-py."""

from typing import TYPE_CHECKING

from airflow_jetstream.client import lazy_exports

if TYPE_CHECKING:
    from airflow_jetstream.client.ledger.batch_ledger import BatchLedger
    from airflow_jetstream.client.ledger.records import batch_key, counts_key, shard_of

__all__ = ["BatchLedger", "batch_key", "counts_key", "shard_of"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "batch_ledger": ("BatchLedger",),
    "records": ("batch_key", "counts_key", "shard_of"),
})
