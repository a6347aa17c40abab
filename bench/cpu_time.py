"""CPU time of another process, for the benchmarks' per-message server CPU columns (Linux ``/proc``)."""

from __future__ import annotations

import os
from pathlib import Path


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
