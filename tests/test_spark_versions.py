"""pyspark and pyspark-client of different releases are refused where the provider meets Spark."""

from __future__ import annotations

import pytest

import airflow_jetstream.spark.versions as versions
from airflow_jetstream.client.errors import SparkInstallError
from airflow_jetstream.spark import register
from airflow_jetstream.spark.versions import check_pyspark_install, installed_pyspark_versions


def test_the_installed_pair_is_one_release() -> None:
    found = installed_pyspark_versions()
    assert set(found) == {"pyspark", "pyspark-client"} and len(set(found.values())) == 1
    check_pyspark_install()


def test_a_mismatched_pair_names_both_versions_and_the_fix() -> None:
    with pytest.raises(SparkInstallError) as refused:
        check_pyspark_install({"pyspark": "4.3.0", "pyspark-client": "4.2.0"})
    assert refused.value.reason == "spark_version_mismatch"
    assert "pyspark 4.3.0, pyspark-client 4.2.0" in str(refused.value)
    assert 'pip install "pyspark==4.2.0"' in str(refused.value)


def test_one_distribution_alone_is_fine() -> None:
    check_pyspark_install({"pyspark": "4.3.0"})


def test_register_refuses_a_mismatched_install_before_touching_the_session(monkeypatch) -> None:
    monkeypatch.setattr(versions, "installed_pyspark_versions", lambda: {"pyspark": "4.3.0", "pyspark-client": "4.2.0"})
    with pytest.raises(SparkInstallError):
        register(object())  # no session is needed to refuse
