"""Ship the data source to executors that do not have it installed: a zip for ``--py-files``.

The zip holds what a Spark job needs and nothing of Airflow: ``airflow_jetstream`` (package root,
``client`` and ``spark``) and nats-py. nkey and creds authentication also need ``nkeys`` with its
compiled dependency (PyNaCl), which cannot be imported from a zip: install those on the executors
or ship a packed environment with ``spark.archives`` (see docs/spark.md).
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import nats

import airflow_jetstream

#: Parts of airflow_jetstream that executors need (the rest imports Airflow).
SHIPPED_PARTS = ("__init__.py", "version.py", "client", "spark")
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)


def _python_files(root: Path, parts: tuple[str, ...] | None = None) -> Iterator[Path]:
    for part in parts or (".",):
        path = root / part
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        yield from (f for f in files if "__pycache__" not in f.parts)


def build_py_files(target: str | Path) -> Path:
    """Write the zip to ``target`` and return its path; same sources give the same bytes."""
    target = Path(target)
    sources = [
        (Path(airflow_jetstream.__file__).parent, SHIPPED_PARTS),
        (Path(nats.__file__).parent, None),
    ]
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for root, parts in sources:
            for path in _python_files(root, parts):
                name = f"{root.name}/{path.relative_to(root).as_posix()}"
                info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, path.read_bytes())
    return target
