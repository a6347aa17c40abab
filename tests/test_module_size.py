"""A small house: no module of the package is over 500 lines (split it along its jobs instead)."""

from __future__ import annotations

from pathlib import Path

import airflow_jetstream

PACKAGE = Path(airflow_jetstream.__file__).parent
MAX_LINES = 500


def test_no_module_is_over_500_lines():
    sizes = {str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
             for path in PACKAGE.rglob("*.py")}
    assert len(sizes) > 50
    assert {name: lines for name, lines in sizes.items() if lines > MAX_LINES} == {}
