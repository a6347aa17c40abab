"""The one cause of a failed Spark job, recorded by the job's driver for the task that submitted it.

Spark prints a job's Python error several times and spark-submit then only says its exit code. The first
error of this package's vocabulary in that text is the cause (later ones repeat it); without one, the last
exception line is. ``JetStreamSparkSubmitOperator`` names a file in :data:`FAILURE_FILE_CONF`; ``register``
in the driver records there the cause of an exception that ends the driver (``sys.excepthook``). The file is
on the operator's host, so this works in client deploy mode; elsewhere the write fails quietly and the
operator falls back to the spark-submit output Airflow's error carries.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from airflow_jetstream.client.errors import SparkInstallError

#: The Spark conf key naming the file the driver records the failure's cause in.
FAILURE_FILE_CONF = "spark.jetstream.job.failureFile"

#: ``package.module.SomeError: message`` anywhere in a line (Spark prefixes its own text).
_EXCEPTION_LINE = re.compile(r"(?:^|[\s:])((?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception))): (\S.*)$")
_OURS = "airflow_jetstream."
#: Spark's line for a task an executor lost: ``Lost task 0.0 in stage 0.0 (TID 0) (10.0.0.5 executor 1): ...`` or
#: ``... (TID 1) on 10.0.0.5, executor 1: ...``: the executor's host.
_LOST_TASK = re.compile(r"Lost task \S+ in stage \S+ \(TID \d+\) (?:\((\S+) executor|on ([^\s,]+), executor)")
#: An executor's Python that is not the driver's minor version (PySpark's error class).
_VERSION_MISMATCH = re.compile(r"\[PYTHON_VERSION_MISMATCH\].*?version:? (\d+\.\d+) than that in driver:? (\d+\.\d+)")
#: The package, or nats-py it ships with, missing on an executor's Python.
_PACKAGE_MISSING = re.compile(r"No module named '(airflow_jetstream|nats)[.']")


class SparkFailureCause:
    """Reads a failed job's text line by line; :attr:`cause` names the failure.

    An executor host whose Python cannot run the job (another minor version than the driver's, or no package) is
    a :class:`~airflow_jetstream.client.errors.SparkInstallError` naming that host and the fix: Spark's own text
    names the host only in its "Lost task" line, pages away from PySpark's error."""

    def __init__(self) -> None:
        self._ours: str | None = None
        self._last: str | None = None
        self._host: str | None = None
        self._install: tuple[str, str] | None = None

    def feed(self, line: str | bytes) -> None:
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
        lost = _LOST_TASK.search(text)
        if lost and self._host is None:
            self._host = lost.group(1) or lost.group(2)
        self._install = self._install or _install_problem(text)
        match = _EXCEPTION_LINE.search(text.strip())
        if not match:
            return
        qualified, name, message = match.groups()
        shown = f"{name}: {message}"
        if qualified.startswith(_OURS):
            self._ours = self._ours or shown
        else:
            self._last = shown

    def watch(self, lines: Iterable[str | bytes]) -> Iterator[str | bytes]:
        """Pass ``lines`` through unchanged, reading each."""
        for line in lines:
            self.feed(line)
            yield line

    @property
    def cause(self) -> str | None:
        if self._install and not self._ours:
            problem, reason = self._install
            error = SparkInstallError(f"executor host {self._host or '(unknown)'}: {problem}", reason=reason)
            return f"{type(error).__name__}: {error}"
        return self._ours or self._last


def _install_problem(text: str) -> tuple[str, str] | None:
    """What an executor's Python lacks to run the job with the fix, and the reason code; or None."""
    mismatch = _VERSION_MISMATCH.search(text)
    if mismatch:
        worker, driver = mismatch.groups()
        return (f"its Python is {worker} and the driver's {driver} (PySpark runs one minor version on both): set "
                f"spark.pyspark.python to a Python {driver} with pyspark on that host", "python_mismatch")
    missing = _PACKAGE_MISSING.search(text)
    if missing:
        return (f"its Python has no {missing.group(1)}: pass ship_package=True to ship the package with the job, or "
                "install airflow-jetstream[spark] there", "package_missing")
    return None


def cause_in(text: str) -> str | None:
    """The cause named in ``text`` (a traceback, spark-submit's output), or None."""
    reader = SparkFailureCause()
    for line in text.splitlines():
        reader.feed(line)
    return reader.cause


def record_failures(spark: Any) -> None:
    """In a driver submitted by ``JetStreamSparkSubmitOperator``: record the cause of an exception that ends
    the driver in the file the conf names. Once per process; elsewhere (no such conf, Spark Connect) nothing."""
    path = spark.conf.get(FAILURE_FILE_CONF, None)
    if not path or getattr(sys.excepthook, "records_to", None) == path:
        return
    previous = sys.excepthook

    def record(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        cause = cause_in("".join(traceback.format_exception(kind, error, tb)))
        if cause:
            try:
                partial = Path(f"{path}.partial")
                partial.write_text(cause, encoding="utf-8")
                os.replace(partial, path)
            except OSError:
                pass  # the driver runs away from the operator's host: it reads spark-submit's output instead
        previous(kind, error, tb)

    record.records_to = path  # type: ignore[attr-defined]
    sys.excepthook = record


def recorded_cause(path: str | Path) -> str | None:
    """The cause the driver recorded in ``path``, if it did."""
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None
