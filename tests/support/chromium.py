"""Debian's ``chromium`` for the browser tests, installed with apt-get where missing (root only), once.

The standard library only, so CI can install it before the venv exists, beside ``make install``:
``python3 -m tests.support.chromium`` (.ci/run). Under pytest-xdist two workers may ask at once: an
exclusive lock makes the second wait for the first's apt-get instead of failing on dpkg's lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
LOCK = Path("/tmp/airflow-jetstream-chromium-install.lock")


def install_chromium() -> str | None:
    """Make sure /usr/bin/chromium exists; returns why it cannot, or None."""
    if CHROMIUM.exists():
        return None
    if shutil.which("apt-get") is None:
        return "no /usr/bin/chromium and no apt-get to install Debian's chromium package"
    if os.geteuid() != 0:
        return "no /usr/bin/chromium and not root, so apt-get cannot install Debian's chromium package"
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be installing it right now
        if CHROMIUM.exists():
            return None
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium", "chromium-driver"],
        ):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                return f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}"
    return None if CHROMIUM.exists() else "apt-get installed chromium but /usr/bin/chromium is missing"


if __name__ == "__main__":
    started = time.monotonic()
    problem = install_chromium()
    print(f"chromium: {problem or f'{CHROMIUM} ready'} ({time.monotonic() - started:.0f} s)")
    sys.exit(1 if problem else 0)
