"""Stall a server process (SIGSTOP) and resume it (SIGCONT), as a frozen VM or a long GC pause would."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def stop(pid: int) -> None:
    """SIGSTOP ``pid`` and return once every thread of it is stopped (the signal is delivered asynchronously)."""
    os.kill(pid, signal.SIGSTOP)
    tasks = Path(f"/proc/{pid}/task")
    for _ in range(5000):  # bounded: delivery takes microseconds to milliseconds
        states = {(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()}
        if states <= {"T", "t"}:
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop")


def resume(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)
