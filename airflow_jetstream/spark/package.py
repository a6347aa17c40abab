"""Ship the data source to Python workers that do not have it installed: a zip for ``--py-files``,
``SparkContext.addPyFile`` or, on Spark Connect, a session artifact.

The zip holds what a Spark job needs and nothing of Airflow: ``airflow_jetstream`` (package root,
``client`` and ``spark``) and nats-py. nkey and creds authentication also need ``nkeys`` with its
compiled dependency (PyNaCl), which cannot be imported from a zip: install those on the executors
or ship a packed environment with ``spark.archives`` (see docs/spark.md).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats

import airflow_jetstream

#: Parts of airflow_jetstream that executors need (the rest imports Airflow).
SHIPPED_PARTS = ("__init__.py", "version.py", "client", "spark")
#: The zip's file name (Spark keys added files and artifacts by name).
PACKAGE_ZIP = "airflow_jetstream_spark.zip"
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


@functools.cache
def process_zip() -> Path:
    """The zip, built once per process (the same path for every session: adding it again is a no-op).

    Its temporary directory is removed when the process exits (not by a forked child that inherits it).
    """
    folder = Path(tempfile.mkdtemp(prefix="airflow-jetstream-spark-"))
    atexit.register(_remove_if_mine, folder, os.getpid())
    return build_py_files(folder / PACKAGE_ZIP)


def _remove_if_mine(folder: Path, creator: int) -> None:
    if os.getpid() == creator:
        shutil.rmtree(folder, ignore_errors=True)


def is_connect_session(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, artifacts instead of addPyFile)."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def add_package_to_session(spark: Any) -> None:
    """Put the zip on the ``sys.path`` of the session's Python workers (and of a classic driver).

    Spark Connect: ``spark.addArtifacts(zip, pyfile=True)``, which a data source registered
    afterwards sees (register() calls this first). Classic: ``SparkContext.addPyFile``.
    """
    path = str(process_zip())
    if is_connect_session(spark):
        spark.addArtifacts(path, pyfile=True)
    else:
        spark.sparkContext.addPyFile(path)
