"""JetStream advisories: kinds and parsing, filters, and the capture stream with its readers.

The names below are imported on first use, so importing a parsing or filter module imports no nats-py."""

from typing import TYPE_CHECKING

from airflow_jetstream.client import lazy_exports

if TYPE_CHECKING:
    from airflow_jetstream.client.advisories.capture import ensure_capture_stream, find_captured, watch_advisories
    from airflow_jetstream.client.advisories.types import AdvisoryFilter, advisory_subject

__all__ = ["AdvisoryFilter", "advisory_subject", "ensure_capture_stream", "find_captured", "watch_advisories"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "capture": ("ensure_capture_stream", "find_captured", "watch_advisories"),
    "types": ("AdvisoryFilter", "advisory_subject"),
})
