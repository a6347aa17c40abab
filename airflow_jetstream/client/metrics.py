"""A pluggable metrics sink: no-op by default, Airflow's ``Stats`` once the Airflow layer is imported.

client/ must not import Airflow, so the hook installs the sink (see ``hooks/jetstream.py``).
Names are dotted and prefixed with ``jetstream.`` by the sink, e.g. ``jetstream.batch.committed``.
"""

from __future__ import annotations

from typing import Any, Protocol


class MetricsSink(Protocol):
    def incr(self, name: str, count: int = 1, tags: dict[str, str] | None = None) -> None: ...

    def timing(self, name: str, millis: float, tags: dict[str, str] | None = None) -> None: ...

    def gauge(self, name: str, value: float, tags: dict[str, str] | None = None) -> None: ...


class _NoMetrics:
    def incr(self, *args: Any, **kwargs: Any) -> None:
        """Drops the metric (each kind alike)."""

    timing = gauge = incr


_sink: MetricsSink = _NoMetrics()


def set_metrics_sink(sink: MetricsSink | None) -> None:
    """Install a sink (None restores the no-op sink)."""
    global _sink
    _sink = sink or _NoMetrics()


def incr(name: str, count: int = 1, tags: dict[str, str] | None = None) -> None:
    _sink.incr(name, count, tags)


def timing(name: str, millis: float, tags: dict[str, str] | None = None) -> None:
    _sink.timing(name, millis, tags)


def gauge(name: str, value: float, tags: dict[str, str] | None = None) -> None:
    _sink.gauge(name, value, tags)
