"""A Python for Spark's workers that cannot import the project's packages from the venv.

A wrapper around the same interpreter with a ``sitecustomize`` that refuses ``airflow_jetstream``,
nats-py and Airflow unless they come from a ``.zip`` on ``sys.path`` (a shipped package): building a
second virtualenv with pyspark would take minutes.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: The workers' sitecustomize: the project's packages only from a shipped zip, never from the venv.
BLOCKER = '''
import importlib.machinery, sys
GUARDED = ("airflow_jetstream", "nats", "airflow")

class ShippedOnly:
    def find_spec(self, name, path=None, target=None):
        if path is not None or name.split(".")[0] not in GUARDED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [p for p in sys.path if p.endswith(".zip")])
        if spec is None:
            raise ModuleNotFoundError(f"{name} is not installed for this Python (test sitecustomize)", name=name)
        print(f"shipped import: {name} from {spec.origin}", file=sys.stderr, flush=True)
        return spec

sys.meta_path.insert(0, ShippedOnly())
'''


def make_bare_python(directory: Path) -> Path:
    """Write the wrapper and its sitecustomize into ``directory``; return the wrapper (for PYSPARK_PYTHON)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(BLOCKER)
    python = directory / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{directory}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return python
