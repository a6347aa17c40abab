"""The job's driver and the task that submitted it: the ``nats`` connection in, progress and a failure's cause out.

The connection reaches the data source inside the registered class: ``register`` registers a class built for
the connection's fields (:func:`connected_source`), which Spark pickles by value into the tasks (and Spark
Connect into the registration), so the fields never pass through Spark conf. They come from
``register(spark, settings)`` or from the private properties file ``JetStreamSparkSubmitOperator`` writes
(``spark.jetstream.*``; secrets under ``spark.jetstream.secret.*``, which Spark redacts and Spark Connect hides
from its clients: conf cannot carry them over Connect).

Progress lines go to the driver's stderr, which spark-submit (and so the Airflow task log, through
SparkSubmitHook) shows, whatever logging the application configured.

The one cause of a failed job: Spark prints a job's Python error several times and spark-submit then only says
its exit code. The first error of this package's vocabulary in that text is the cause (later ones repeat it);
without one, the last exception line is. ``JetStreamSparkSubmitOperator`` names a file in
:data:`FAILURE_FILE_CONF`; ``register`` in the driver records there the cause of an exception that ends the
driver (``sys.excepthook``). The file is on the operator's host, so this works in client deploy mode; elsewhere
the write fails quietly and the operator falls back to the spark-submit output Airflow's error carries.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from airflow_jetstream.client.connection import open_connection
from airflow_jetstream.client.errors import InvalidSettingsError, SparkInstallError
from airflow_jetstream.client.settings import SECRET_FIELDS, SETTINGS_FIELDS, ConnectionSettings, settings_to_fields

CONF_PREFIX = "spark.jetstream."
SECRET_CONF_PREFIX = "spark.jetstream.secret."
#: Keys the submitting operator sets for the job itself (:data:`FAILURE_FILE_CONF`).
JOB_CONF_PREFIX = "spark.jetstream.job."
#: Fields that pick the authentication: options naming any of them replace all of the conf's.
AUTH_FIELDS = ("user", "password", "token", "nkey_seed_secret", "creds_file")
Source = TypeVar("Source", bound=type)
T = TypeVar("T")


def conf_key(name: str) -> str:
    """The Spark conf key of a connection field (secrets under ``spark.jetstream.secret.``)."""
    return f"{SECRET_CONF_PREFIX if name in SECRET_FIELDS else CONF_PREFIX}{name}"


def settings_to_conf(settings: ConnectionSettings) -> dict[str, str]:
    """Spark conf entries carrying ``settings`` (defaults left out)."""
    return {conf_key(name): value for name, value in settings_to_fields(settings).items()}


def fields_from_conf(conf: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Connection fields from Spark conf pairs; an unknown ``spark.jetstream.*`` key is an error
    (``spark.jetstream.job.*`` are the submitting operator's, not the connection's)."""
    known = {conf_key(name): name for name in SETTINGS_FIELDS}
    found: dict[str, str] = {}
    for key, value in conf:
        if key.startswith(CONF_PREFIX) and not key.startswith(JOB_CONF_PREFIX):
            if key not in known:
                raise InvalidSettingsError(f"unknown Spark conf key {key!r}; the jetstream data source knows "
                                           f"{', '.join(known)}")
            found[known[key]] = value
    return found


def with_connection_defaults(defaults: Mapping[str, str], options: Mapping[str, str]) -> dict[str, str]:
    """Options over the conf's connection fields; options that name any auth field replace all of the conf's."""
    replaced = AUTH_FIELDS if any(options.get(name) for name in AUTH_FIELDS) else ()
    return {**{name: value for name, value in defaults.items() if name not in replaced}, **options}


def session_connection_fields(spark: object) -> dict[str, str]:
    """The connection fields in a SparkSession's conf (empty when the job got none)."""
    return fields_from_conf(spark.conf.getAll.items())  # type: ignore[attr-defined]


def connected_source(base: Source, fields: Mapping[str, str]) -> Source:
    """A subclass of the data source ``base`` whose ``connection_defaults`` are ``fields``.

    Built per registration and importable from no module, so cloudpickle sends it by value, the
    fields with it; ``base`` travels by reference (the Python workers import the package).
    """
    return type(f"Connected{base.__name__}", (base,), {"connection_defaults": dict(fields)})  # type: ignore[return-value]


def run(settings: ConnectionSettings, func: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """``await func(conn, *args, **kwargs)`` on a new connection, in a new event loop (the driver's and tasks' calls
    from Spark's synchronous methods)."""

    async def call() -> T:
        async with open_connection(settings) as conn:
            return await func(conn, *args, **kwargs)

    return asyncio.run(call())


def rate(count: int, seconds: float) -> str:
    """``"12,345/s"``, or ``"-"`` when no time was measured."""
    return f"{count / seconds:,.0f}/s" if seconds > 0 else "-"


def progress(line: str) -> None:
    print(f"jetstream: {line}", file=sys.stderr, flush=True)


#: The Spark conf key naming the file the driver records the failure's cause in.
FAILURE_FILE_CONF = f"{JOB_CONF_PREFIX}failureFile"

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

