"""What the job's Python needs: this package, shipped to Python workers that do not have it (a zip for
``--py-files``, ``addPyFile`` or a Spark Connect artifact), and pyspark's Python files of one release with its jars.

The zip holds ``SHIPPED_PACKAGES``, every other module of the package they import (found by reading their
imports when the zip is built, so a new import cannot leave it short), and nats-py; nothing of Airflow.
nkey/creds auth also needs ``nkeys`` and PyNaCl, which cannot load from a zip (docs/spark.md).

``pyspark`` and ``pyspark-client`` both install the ``pyspark`` package; with two releases installed, the
one pip writes last owns the shared files (pyspark-client after pyspark), so 4.2.0 Python code could run on
4.3.0 jars. :func:`check_pyspark_install` reads what is on disk: it accepts two releases whose shared files are
all pyspark's and refuses any other mix (docs/compatibility.md, "pyspark and pyspark-client").
"""

from __future__ import annotations

import ast
import atexit
import base64
import csv
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import nats

import airflow_jetstream
from airflow_jetstream.client.errors import SparkInstallError

#: The subpackages of airflow_jetstream shipped whole: the data source and the asyncio toolkit it runs on
#: (which executors' own code may use too). Whatever else of the package they import is added to them.
SHIPPED_PACKAGES = ("client", "spark")
#: The zip's file name (Spark keys added files and artifacts by name).
PACKAGE_ZIP = "airflow_jetstream_spark.zip"
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)


def _python_files(folder: Path) -> Iterator[Path]:
    yield from (f for f in sorted(folder.rglob("*.py")) if "__pycache__" not in f.parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that can run: at any depth (functions import lazily), but not under
    ``if TYPE_CHECKING:``."""
    nodes: list[ast.AST] = [tree]
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            nodes.extend(node.orelse)
        else:
            nodes.extend(ast.iter_child_nodes(node))


def imported_names(source: bytes, module: str, *, is_package: bool) -> set[str]:
    """The absolute names that ``module``'s import statements may load: ``from a import b`` gives both
    ``a`` and ``a.b`` (``b`` is a submodule or a name defined in ``a``; the caller keeps what is a module)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in _runtime_imports(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        names.add(base)
        names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def module_name(package_dir: Path, file: Path) -> str:
    """``airflow_jetstream.client.errors`` for ``<package_dir>/client/errors.py``."""
    parts = file.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_file(package_dir: Path, name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] != package_dir.name:
        return None
    path = package_dir.joinpath(*parts[1:])
    return next((f for f in (path / "__init__.py", path.with_suffix(".py")) if f.is_file()), None)


def package_files(package_dir: Path, packages: Iterable[str] = SHIPPED_PACKAGES) -> list[Path]:
    """The files of the package at ``package_dir`` that executors need: every module of ``packages``
    and, transitively, every module of the package they import, with the ``__init__.py`` files that
    importing them runs.

    Only a module with an import statement naming the package other than through ``packages`` (or a
    relative one) is parsed: the others import nothing of the package that is not in already.
    """
    other = rf"{re.escape(package_dir.name)}(?![.](?:{'|'.join(map(re.escape, packages))})\b)"
    names_more = [re.compile(rf"import[ \t][^\n#;]*?{other}".encode()),
                  re.compile(rf"from[ \t]+(?:{other}|[.])".encode())]
    todo = [f for p in packages for f in _python_files(package_dir / p)]
    files: set[Path] = set()
    while todo:
        file = todo.pop()
        if file in files:
            continue
        files.add(file)
        inits = (package_dir / folder / "__init__.py" for folder in file.relative_to(package_dir).parents)
        todo.extend(f for f in inits if f.is_file())
        source = file.read_bytes()
        if any(pattern.search(source) for pattern in names_more):
            imported = imported_names(source, module_name(package_dir, file), is_package=file.name == "__init__.py")
            todo.extend(f for f in (_module_file(package_dir, n) for n in imported) if f is not None)
    return sorted(files)


def build_py_files(target: str | Path) -> Path:
    """Write the zip to ``target`` and return its path; same sources give the same bytes."""
    target = Path(target)
    package_dir, nats_dir = Path(airflow_jetstream.__file__).parent, Path(nats.__file__).parent
    sources = [(package_dir, package_files(package_dir)), (nats_dir, list(_python_files(nats_dir)))]
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for root, files in sources:
            for path in files:
                info = zipfile.ZipInfo(path.relative_to(root.parent).as_posix(), date_time=_FIXED_TIME)
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


def add_package_to_session(spark: Any) -> None:
    """Put the zip on the ``sys.path`` of the session's Python workers (and of a classic driver).

    Spark Connect: ``spark.addArtifacts(zip, pyfile=True)``, which a data source registered
    afterwards sees (register() calls this first). Classic: ``SparkContext.addPyFile``.
    """
    path = str(process_zip())
    if type(spark).__module__.startswith("pyspark.sql.connect."):  # Spark Connect: no SparkContext
        spark.addArtifacts(path, pyfile=True)
    else:
        spark.sparkContext.addPyFile(path)


#: Distributions that install the ``pyspark`` Python package.
PYSPARK_DISTRIBUTIONS = ("pyspark", "pyspark-client")


def _distributions(path: list[str] | None) -> dict[str, metadata.Distribution]:
    found: dict[str, metadata.Distribution] = {}
    for dist in (metadata.distributions() if path is None else metadata.distributions(path=path)):
        name = (dist.metadata["Name"] or "").lower()
        if name in PYSPARK_DISTRIBUTIONS:
            found.setdefault(name, dist)  # the first on the path is the one Python imports
    return found


def installed_pyspark_versions(path: list[str] | None = None) -> dict[str, str]:
    """``{distribution: version}`` of the pyspark distributions installed (on ``path``, default ``sys.path``)."""
    return {name: dist.version for name, dist in sorted(_distributions(path).items())}


def _record(dist: metadata.Distribution) -> dict[str, str]:
    """``{path: "algorithm=digest"}`` of the files ``dist``'s RECORD lists with a hash (read as written: some
    importlib.metadata versions leave missing files out of ``Distribution.files``)."""
    rows = csv.reader((dist.read_text("RECORD") or "").splitlines())
    return {row[0]: row[1] for row in rows if len(row) >= 2 and "=" in row[1]}


def pyspark_files_not_pysparks(path: list[str] | None = None) -> list[str]:
    """The files pyspark and pyspark-client share whose bytes on disk are not the ones pyspark's RECORD lists
    ([] when one of them is not installed). Reads each shared file once (~370 files, well under 0.1 s)."""
    dists = _distributions(path)
    if set(dists) != set(PYSPARK_DISTRIBUTIONS):
        return []
    own, client = (_record(dists[name]) for name in PYSPARK_DISTRIBUTIONS)
    changed = []
    for name in sorted(own.keys() & client.keys()):
        algorithm, _, expected = own[name].partition("=")
        try:
            data = Path(str(dists["pyspark"].locate_file(name))).read_bytes()
        except OSError:
            changed.append(name)
            continue
        if base64.urlsafe_b64encode(hashlib.new(algorithm, data).digest()).rstrip(b"=").decode() != expected:
            changed.append(name)
    return changed


def check_pyspark_install(versions: dict[str, str] | None = None, *, path: list[str] | None = None) -> None:
    """Raise :class:`SparkInstallError` (``spark_version_mismatch``) when pyspark's Python files on disk are not
    all of the release of its jars: pyspark and pyspark-client of different releases, unless every file they
    share is pyspark's. ``versions`` replaces what is installed (the files are then not read)."""
    given = versions is not None
    versions = dict(versions) if versions is not None else installed_pyspark_versions(path)
    if len(set(versions.values())) <= 1:
        return
    pyspark, client = versions.get("pyspark", "?"), versions.get("pyspark-client", "?")
    changed = [] if given else pyspark_files_not_pysparks(path)
    if not given and not changed:
        return  # two releases, but every shared file on disk is pyspark's: one release with its jars
    found = f" ({len(changed)} of pyspark's files on disk are pyspark-client's)" if changed else ""
    raise SparkInstallError(
        f"pyspark {pyspark} and pyspark-client {client} are installed: they share pyspark's Python files{found}, so "
        f"Spark would run Python code of {client} beside the jars of {pyspark}. Install one release of both, "
        f'pip install "pyspark=={client}" "pyspark-client=={client}" (the airflow-jetstream[spark] extra declares a '
        f'matching pair), or put pyspark\'s own files back last: pip install --force-reinstall --no-deps '
        f'"pyspark=={pyspark}"')
