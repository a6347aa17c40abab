"""One Spark ``local[2]`` session for a test module: quiet, no UI, loopback only, the data source registered."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from typing import Any


def local_spark(app_name: str, *, register_source: bool = True, conf: dict[str, str] | None = None) -> Iterator[Any]:
    """Yield a ``SparkSession`` (the body of a module-scoped fixture); ``conf`` adds Spark settings."""
    from pyspark.sql import SparkSession

    from airflow_jetstream.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # py4j logs at INFO from __del__ at interpreter exit, after pytest closed its log stream
    logging.getLogger("py4j").setLevel(logging.WARNING)
    builder = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if register_source:
        register(session)
    yield session
    session.stop()


def module_spark(app_name: str, **kwargs: Any) -> Any:
    """A module-scoped fixture named ``spark``: :func:`local_spark` for the module's tests."""
    import pytest

    @pytest.fixture(scope="module", name="spark")
    def spark() -> Iterator[Any]:
        yield from local_spark(app_name, **kwargs)

    return spark
