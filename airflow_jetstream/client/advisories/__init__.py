"""JetStream advisories: kinds and parsing, filters, and the capture stream with its readers.

The names below are imported on first use, so importing a parsing or filter module imports no nats-py."""

from typing import TYPE_CHECKING

from airflow_jetstream.client.lazy import lazy_exports

if TYPE_CHECKING:
    from airflow_jetstream.client.advisories.capture import (
        CaptureReader,
        capture_gap,
        capture_info,
        capture_stream_config,
        ensure_capture_stream,
        find_captured,
        listen_live,
        watch_advisories,
    )
    from airflow_jetstream.client.advisories.filter import AdvisoryFilter
    from airflow_jetstream.client.advisories.types import (
        DEFAULT_CAPTURE_STREAM,
        DEFAULT_CAPTURE_SUBJECTS,
        KINDS,
        Advisory,
        AdvisoryKind,
        advisory_subject,
        parse_advisory,
    )

__all__ = [
    "DEFAULT_CAPTURE_STREAM",
    "DEFAULT_CAPTURE_SUBJECTS",
    "KINDS",
    "Advisory",
    "AdvisoryFilter",
    "AdvisoryKind",
    "CaptureReader",
    "advisory_subject",
    "capture_gap",
    "capture_info",
    "capture_stream_config",
    "ensure_capture_stream",
    "find_captured",
    "listen_live",
    "parse_advisory",
    "watch_advisories",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    "capture": ("CaptureReader", "capture_gap", "capture_info", "capture_stream_config", "ensure_capture_stream",
                "find_captured", "listen_live", "watch_advisories"),
    "filter": ("AdvisoryFilter",),
    "types": ("DEFAULT_CAPTURE_STREAM", "DEFAULT_CAPTURE_SUBJECTS", "KINDS", "Advisory", "AdvisoryKind",
              "advisory_subject", "parse_advisory"),
})
