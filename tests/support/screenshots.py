"""Where the browser tests save their screenshots: ``docs/img`` under ``make screenshots`` (which sets
``SCREENSHOTS_DIR``), a temporary folder otherwise, so a test run leaves the checkout as it was."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def screenshot_path(name: str) -> Path:
    """The file a browser test saves the screenshot ``name`` to (its folder exists)."""
    folder = Path(os.environ.get("SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / "airflow-jetstream-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name
