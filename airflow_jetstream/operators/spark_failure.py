"""The one cause of a failed Spark job, picked from what spark-submit printed.

Spark prints a Python error of the job several times (the executor's traceback, the lost task, the
aborted stage, the driver's re-raise) and spark-submit then only says its exit code. The first
error of this package's vocabulary in that output is the cause (later ones repeat it); without one,
the last exception line is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

#: ``package.module.SomeError: message`` anywhere in a line (Spark prefixes its own text).
_EXCEPTION_LINE = re.compile(r"(?:^|[\s:])((?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception))): (\S.*)$")
_OURS = "airflow_jetstream."


class SparkFailureCause:
    """Reads spark-submit's output lines as they pass; :attr:`cause` names the failure."""

    def __init__(self) -> None:
        self._ours: str | None = None
        self._last: str | None = None

    def feed(self, line: str | bytes) -> None:
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
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
        return self._ours or self._last
