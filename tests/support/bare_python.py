"""A Python for Spark's workers that cannot import the project's packages from the venv.

A wrapper around the same interpreter with a ``sitecustomize`` that refuses ``airflow_jetstream``,
nats-py and Airflow, every submodule included, unless they come from a ``.zip`` on ``sys.path`` (a
shipped package): building a second virtualenv with pyspark would take minutes. Submodules need the
guard too: the venv's editable install of the project finds a module directly under
``airflow_jetstream`` in the source tree whatever the package's ``__path__`` says, so such a module
missing from the zip would still import.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

#: The workers' sitecustomize: the project's packages only from a shipped zip, never from the venv.
BLOCKER = '''
import importlib.machinery, os, sys
GUARDED = ("airflow_jetstream", "nats", "airflow")
ABSENT = {absent!r}

def shipped(entry):
    return any(entry == z or entry.startswith(z + os.sep) for z in sys.path if z.endswith(".zip"))

class ShippedOnly:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in ABSENT:
            raise ModuleNotFoundError(f"No module named {{name!r}} (test sitecustomize: not installed)", name=name)
        if top not in GUARDED:
            return None
        where = [p for p in (sys.path if path is None else path) if shipped(p)]
        spec = importlib.machinery.PathFinder.find_spec(name, where)
        if spec is None and path is None:
            raise ModuleNotFoundError(f"{{name}} is not installed for this Python (test sitecustomize)", name=name)
        if spec is None:
            raise ModuleNotFoundError(f"{{name}} is not in the shipped zip (test sitecustomize)", name=name)
        if path is None:
            print(f"shipped import: {{name}} from {{spec.origin}}", file=sys.stderr, flush=True)
        return spec

sys.meta_path.insert(0, ShippedOnly())
'''


def make_bare_python(directory: Path, *, absent: Iterable[str] = ()) -> Path:
    """Write the wrapper and its sitecustomize into ``directory``; return the wrapper (for PYSPARK_PYTHON).

    ``absent``: more top-level packages this Python refuses from anywhere, as if not installed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(BLOCKER.format(absent=tuple(absent)))
    python = directory / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{directory}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return python
