"""JetStream advisories: kinds and parsing, filters, and the capture stream with its readers."""

from airflow_jetstream.client.advisories.capture import (
    DEFAULT_CAPTURE_STREAM,
    DEFAULT_CAPTURE_SUBJECTS,
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

__all__ = [
    "DEFAULT_CAPTURE_STREAM",
    "DEFAULT_CAPTURE_SUBJECTS",
    "AdvisoryFilter",
    "CaptureReader",
    "capture_gap",
    "capture_info",
    "capture_stream_config",
    "ensure_capture_stream",
    "find_captured",
    "listen_live",
    "watch_advisories",
]
