"""pyspark's Python files on disk must be one release with its jars: pyspark and pyspark-client (the Spark
provider's dependency) install the same files, and the one installed last owns them.

The layouts below are site-packages folders with both distributions' metadata (METADATA, RECORD with
hashes) and the files as the install order left them: pip writes pyspark-client after pyspark (measured with
pip 23.2.1 and 26.3; docs/compatibility.md), a force-reinstall of pyspark puts its own files back, a parallel
installer can mix them. The same check on a real pip install of pyspark 4.3.0 + pyspark-client 4.2.0 found
104 files of pyspark's replaced.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from airflow_jetstream.client.errors import SparkInstallError
from airflow_jetstream.spark import register
from airflow_jetstream.spark.package import check_pyspark_install, installed_pyspark_versions

#: file -> (pyspark 4.3.0's bytes, pyspark-client 4.2.0's bytes); the jar is pyspark's only.
SHARED = {"pyspark/version.py": (b"__version__ = '4.3.0'\n", b"__version__ = '4.2.0'\n"),
          "pyspark/sql/datasource.py": (b"# 4.3.0 data source API\n", b"# 4.2.0 data source API\n"),
          "pyspark/util.py": (b"# unchanged between releases\n", b"# unchanged between releases\n")}
JAR = "pyspark/jars/spark-core_2.13-4.3.0.jar"


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _site(root: Path, on_disk: dict[str, int], pyspark: str = "4.3.0", client: str = "4.2.0") -> list[str]:
    """A site-packages with both distributions; ``on_disk``: per shared file, whose bytes are there (0 pyspark's,
    1 pyspark-client's)."""
    for name, version, own, index in (("pyspark", pyspark, [*SHARED, JAR], 0),
                                      ("pyspark_client", client, list(SHARED), 1)):
        info = root / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
        rows = [f"{path},{_hash(SHARED[path][index] if path in SHARED else b'jar')},1" for path in own]
        (info / "RECORD").write_text("\n".join([*rows, f"{info.name}/RECORD,,"]) + "\n")
    for path, whose in {**on_disk, JAR: 0}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(SHARED[path][whose] if path in SHARED else b"jar")
    return [str(root)]


def test_the_installed_pair_is_one_release() -> None:
    found = installed_pyspark_versions()
    assert set(found) == {"pyspark", "pyspark-client"} and len(set(found.values())) == 1
    check_pyspark_install()


def test_pyspark_client_written_last_is_refused_naming_both_releases_and_both_fixes(tmp_path: Path) -> None:
    path = _site(tmp_path, dict.fromkeys(SHARED, 1))
    assert installed_pyspark_versions(path) == {"pyspark": "4.3.0", "pyspark-client": "4.2.0"}
    with pytest.raises(SparkInstallError) as refused:
        check_pyspark_install(path=path)
    assert refused.value.reason == "spark_version_mismatch"
    message = str(refused.value)
    assert "pyspark 4.3.0 and pyspark-client 4.2.0 are installed" in message
    assert "(2 of pyspark's files on disk are pyspark-client's)" in message  # util.py is the same in both
    assert 'pip install "pyspark==4.2.0" "pyspark-client==4.2.0"' in message
    assert 'pip install --force-reinstall --no-deps "pyspark==4.3.0"' in message


def test_two_releases_whose_shared_files_are_all_pysparks_are_one_release_on_disk(tmp_path: Path) -> None:
    check_pyspark_install(path=_site(tmp_path, dict.fromkeys(SHARED, 0)))


def test_a_mix_of_both_releases_is_refused(tmp_path: Path) -> None:
    mixed = {"pyspark/version.py": 0, "pyspark/sql/datasource.py": 1, "pyspark/util.py": 0}
    with pytest.raises(SparkInstallError, match=r"\(1 of pyspark's files on disk are pyspark-client's\)"):
        check_pyspark_install(path=_site(tmp_path, mixed))


def test_a_missing_shared_file_is_refused(tmp_path: Path) -> None:
    path = _site(tmp_path, dict.fromkeys(SHARED, 0))
    (tmp_path / "pyspark" / "sql" / "datasource.py").unlink()  # e.g. removed by uninstalling the other
    with pytest.raises(SparkInstallError, match=r"\(1 of pyspark's files"):
        check_pyspark_install(path=path)


def test_one_release_of_each_or_one_distribution_alone_is_fine(tmp_path: Path) -> None:
    check_pyspark_install(path=_site(tmp_path / "pair", dict.fromkeys(SHARED, 1), pyspark="4.2.0"))
    check_pyspark_install({"pyspark": "4.3.0"})
    check_pyspark_install({"pyspark-client": "4.2.0"})


def test_given_versions_are_judged_without_reading_files() -> None:
    with pytest.raises(SparkInstallError, match=r"pyspark 4\.3\.0 and pyspark-client 4\.2\.0"):
        check_pyspark_install({"pyspark": "4.3.0", "pyspark-client": "4.2.0"})


class _Session:
    class conf:  # a SparkSession's conf, read by register()
        @staticmethod
        def get(key: str, default: str | None = None) -> str | None:
            return default


def test_register_refuses_a_mixed_install_before_touching_the_session(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "path", [*_site(tmp_path, dict.fromkeys(SHARED, 1)), *sys.path])
    with pytest.raises(SparkInstallError):
        register(_Session())  # refused before the data source is registered: the session has no dataSource


def test_the_spark_extra_gives_pyspark_and_pyspark_client_one_range_topped_at_a_pyspark_client_release() -> None:
    """pip picks the newest release of each: with one range whose top is inclusive, both are the top while it
    exists for both, and a newer pyspark (4.3.0 has no pyspark-client) is never picked."""
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    spark = {Requirement(r).name: Requirement(r).specifier for r in project["optional-dependencies"]["spark"]}
    assert spark["pyspark"] == spark["pyspark-client"]
    (top,) = [s for s in spark["pyspark"] if s.operator in ("<", "<=")]
    assert top.operator == "<=", "a top that is a release: '<4.3' would let pip take pyspark 4.2.1 over client 4.2.0"
    assert not spark["pyspark"].contains("4.3.0") and not spark["pyspark"].contains("4.2.1")
    core = {Requirement(r).name for r in project["dependencies"]}
    assert not core & {"pyspark", "pyspark-client", "apache-airflow-providers-apache-spark"}
