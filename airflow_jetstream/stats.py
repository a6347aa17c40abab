"""Forward the client's metrics (``airflow_jetstream.client.metrics``) to Airflow's ``Stats``.

Installed when :mod:`airflow_jetstream.hooks.jetstream` is imported, so every operator, sensor and
trigger reports through the StatsD / OpenTelemetry / Datadog backend configured in ``[metrics]``.
Names get the ``jetstream.`` prefix; tags (e.g. ``reason``) reach backends that support tags.
"""

from __future__ import annotations

from airflow.sdk.observability import stats as airflow_stats

from airflow_jetstream.client import metrics

PREFIX = "jetstream."
# Airflow 3.3 has module-level functions; Airflow 3.2 (task-sdk 1.2) only the ``Stats`` object.
_STATS = airflow_stats if hasattr(airflow_stats, "incr") else airflow_stats.Stats


class AirflowStatsSink:
    """A :class:`~airflow_jetstream.client.metrics.MetricsSink` writing to Airflow's ``Stats``."""

    def incr(self, name: str, count: int = 1, tags: dict[str, str] | None = None) -> None:
        _STATS.incr(PREFIX + name, count, tags=tags)

    def timing(self, name: str, millis: float, tags: dict[str, str] | None = None) -> None:
        _STATS.timing(PREFIX + name, millis, tags=tags)

    def gauge(self, name: str, value: float, tags: dict[str, str] | None = None) -> None:
        _STATS.gauge(PREFIX + name, value, tags=tags)


def install_airflow_stats() -> None:
    """Make Airflow's ``Stats`` the sink of the client's metrics."""
    metrics.set_metrics_sink(AirflowStatsSink())
