"""The view's settings from Airflow's ``[jetstream]`` section (declared in get_provider_info's ``config``).

Read on every request (Airflow caches its config), so a change takes effect without a restart of the
view's code; a value that is not a number or a duration is refused with a typed error naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow.providers.common.compat.sdk import conf

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import InvalidSettingsError, JetStreamError
from airflow_jetstream.get_provider_info import CONFIG_SECTION
from airflow_jetstream.ui.problems import Thresholds

SECTION = "jetstream"


@dataclass(frozen=True)
class ViewSettings:
    """Bounds of one read and of the page, and the problem thresholds."""

    cache_seconds: float = 5.0
    concurrent_reads: int = 2
    timeout: float = 10.0
    request_timeout: float = 5.0
    page_size: int = 50
    max_streams: int = 1000
    max_consumers: int = 5000
    ledger_entries: int = 5000
    advisories: int = 1000
    thresholds: Thresholds = field(default_factory=Thresholds)


def _option(option: str, kind: type[int] | type[float] | None, minimum: float = 0) -> Any:
    """``[jetstream] option`` (its declared default when unset): a number of ``kind`` >= ``minimum``, or with
    ``kind`` None a duration (seconds, or a string like '90s')."""
    text = str(conf.get(SECTION, option, fallback=CONFIG_SECTION["options"][option]["default"]))
    if kind is None:
        try:
            return float(to_seconds(text, field=f"[{SECTION}] {option}"))
        except JetStreamError as exc:
            raise InvalidSettingsError(exc.message, reason="invalid_setting") from None
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise InvalidSettingsError(f"[{SECTION}] {option} = {text!r} must be a number >= {minimum}",
                                   reason="invalid_setting")
    return value


def view_settings() -> ViewSettings:
    """The ``[jetstream]`` options as :class:`ViewSettings` (defaults for those not set)."""
    return ViewSettings(
        cache_seconds=_option("view_cache_seconds", float),
        concurrent_reads=_option("view_concurrent_reads", int, 1),
        timeout=_option("view_timeout", None),
        request_timeout=_option("view_request_timeout", None),
        page_size=_option("view_page_size", int, 1),
        max_streams=_option("view_max_streams", int, 1),
        max_consumers=_option("view_max_consumers", int),
        ledger_entries=_option("view_ledger_entries", int, 1),
        advisories=_option("view_advisories", int),
        thresholds=Thresholds(
            advisory_age=_option("problem_advisory_age", None),
            pending_idle=_option("problem_pending_idle", None),
            redelivered=_option("problem_redelivered", int, 1),
            source_stalled=_option("problem_source_stalled", None),
        ),
    )
