"""pyspark's Python files on disk must be of one release with its jars.

``pyspark`` and ``pyspark-client`` both install the ``pyspark`` package; with two releases installed, the
one pip writes last owns the shared files (pyspark-client after pyspark), so 4.2.0 Python code could run on
4.3.0 jars. This check reads what is on disk: it accepts two releases whose shared files are all pyspark's
and refuses any other mix (docs/compatibility.md, "pyspark and pyspark-client").
"""

from __future__ import annotations

import base64
import csv
import hashlib
from importlib import metadata
from pathlib import Path

from airflow_jetstream.client.errors import SparkInstallError

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
