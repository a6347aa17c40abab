"""The installed pyspark distributions must be one release: ``pyspark`` and ``pyspark-client``
share their Python files, so two releases side by side give Python code of one beside jars of the other."""

from __future__ import annotations

from importlib import metadata

from airflow_jetstream.client.errors import SparkInstallError

#: Distributions that install the ``pyspark`` Python package.
PYSPARK_DISTRIBUTIONS = ("pyspark", "pyspark-client")


def installed_pyspark_versions() -> dict[str, str]:
    """``{distribution: version}`` of the pyspark distributions that are installed."""
    found = {}
    for name in PYSPARK_DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def check_pyspark_install(versions: dict[str, str] | None = None) -> None:
    """Raise :class:`SparkInstallError` when ``pyspark`` and ``pyspark-client`` are of different releases."""
    versions = installed_pyspark_versions() if versions is None else versions
    if len(set(versions.values())) <= 1:
        return
    client = versions.get("pyspark-client", "")
    shown = ", ".join(f"{name} {version}" for name, version in versions.items())
    raise SparkInstallError(
        f"pyspark's distributions are of different releases ({shown}): they share pyspark's Python files, "
        f"so Spark would run Python code of one release beside jars of another. Install one release of both, "
        f"e.g. pip install \"pyspark=={client}\" \"pyspark-client=={client}\" (the Spark provider needs "
        "pyspark-client; constraints/constraints-3.11.txt pins a matching pair)")
