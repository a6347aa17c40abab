"""Progress lines of Spark jobs: written to the driver's stderr, which spark-submit (and so the
Airflow task log, through SparkSubmitHook) shows, whatever logging the application configured."""

from __future__ import annotations

import sys


def rate(count: int, seconds: float) -> str:
    """``"12,345/s"``, or ``"-"`` when no time was measured."""
    return f"{count / seconds:,.0f}/s" if seconds > 0 else "-"


def progress(line: str) -> None:
    """Write one ``jetstream: ...`` progress line to stderr."""
    print(f"jetstream: {line}", file=sys.stderr, flush=True)
