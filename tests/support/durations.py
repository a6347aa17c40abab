"""Per-module run times of the suite (tests/durations.json): the order tests/conftest.py runs modules in.

``make test-durations`` runs the suite once serially with a JUnit report and rewrites the file from it:

    python -m tests.support.durations report.xml > tests/durations.json

The times only order the run (the end-to-end tier's longest modules start first, so two workers finish
together; the fast tier's cheapest modules first, so a failure shows early): a stale file costs minutes, never
a result. A module missing from it gets the median of its tier.
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

FILE = Path(__file__).resolve().parents[1] / "durations.json"


def module_seconds(junit_xml: Path) -> dict[str, float]:
    """Seconds per test module (setup, call and teardown of each test case added up)."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        while module and not module[-1].startswith("test_"):
            module.pop()  # a class inside the module
        if module:
            totals["/".join(module) + ".py"] += float(case.get("time", 0))
    return {name: round(seconds, 1) for name, seconds in sorted(totals.items())}


def load() -> dict[str, float]:
    """The committed times, keyed by the module's path from the repository root (``tests/test_kv.py``)."""
    try:
        return json.loads(FILE.read_text())
    except (OSError, ValueError):
        return {}


def median(times: dict[str, float], modules: list[str]) -> float:
    known = [times[m] for m in modules if m in times]
    return statistics.median(known) if known else 0.0


if __name__ == "__main__":
    print(json.dumps(module_seconds(Path(sys.argv[1])), indent=0, sort_keys=True))
