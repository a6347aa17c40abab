"""The view's settings from Airflow's ``[jetstream]`` section (declared in get_provider_info's ``config``).

Read on every request (Airflow caches its config), so a change takes effect without a restart of the
view's code; a value that is not a number or a duration is refused with a typed error naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def _raw(option: str) -> str:
    default = CONFIG_SECTION["options"][option]["default"]
    return str(conf.get(SECTION, option, fallback=default))


def _number(option: str, kind: type[int] | type[float], minimum: float) -> float:
    text = _raw(option)
    value: float | None
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise InvalidSettingsError(f"[{SECTION}] {option} = {text!r} must be a number >= {minimum}",
                                   reason="invalid_setting")
    return value


def _duration(option: str) -> float:
    text = _raw(option)
    try:
        seconds = to_seconds(text, field=f"[{SECTION}] {option}")
    except JetStreamError as exc:
        raise InvalidSettingsError(exc.message, reason="invalid_setting") from None
    return float(seconds)


def view_settings() -> ViewSettings:
    """The ``[jetstream]`` options as :class:`ViewSettings` (defaults for those not set)."""
    return ViewSettings(
        cache_seconds=_number("view_cache_seconds", float, 0),
        concurrent_reads=int(_number("view_concurrent_reads", int, 1)),
        timeout=_duration("view_timeout"),
        request_timeout=_duration("view_request_timeout"),
        page_size=int(_number("view_page_size", int, 1)),
        max_streams=int(_number("view_max_streams", int, 1)),
        max_consumers=int(_number("view_max_consumers", int, 0)),
        ledger_entries=int(_number("view_ledger_entries", int, 1)),
        advisories=int(_number("view_advisories", int, 0)),
        thresholds=Thresholds(
            advisory_age=_duration("problem_advisory_age"),
            pending_idle=_duration("problem_pending_idle"),
            redelivered=int(_number("problem_redelivered", int, 1)),
            source_stalled=_duration("problem_source_stalled"),
        ),
    )
