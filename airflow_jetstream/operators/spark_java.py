"""spark-submit needs Java on the host that runs it: a Celery worker host runs the Spark driver (client mode). This
is the operator's check (it imports Airflow, so it is not in spark/, which executors receive as a zip without Airflow).

Without it, ``spark-class`` prints "JAVA_HOME is not set" and the task fails with the Spark provider's
"Cannot execute: spark-submit ..." and the whole command line: nothing says which host lacks what. The operator checks
first and fails in one line naming the host (Airflow's ``[core] hostname_callable``, the name the UI shows for the
task) and the fix.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from airflow_jetstream.client.errors import SparkInstallError


def java_missing(env: Mapping[str, str]) -> str | None:
    """What spark-class would not find in ``env`` (it runs ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else the
    ``java`` on PATH), or None when there is a Java to run."""
    java_home = env.get("JAVA_HOME")
    if java_home:
        binary = os.path.join(java_home, "bin", "java")
        return None if os.access(binary, os.X_OK) else f"JAVA_HOME={java_home} has no bin/java"
    if shutil.which("java", path=env.get("PATH", "")) is None:
        return "JAVA_HOME is not set and no java on PATH"
    return None


def this_host() -> str:
    """The task's host as Airflow names it (``[core] hostname_callable``), else the kernel's host name."""
    try:
        from airflow.utils.net import get_hostname

        return str(get_hostname())
    except Exception:  # an Airflow without it, or a hostname_callable that fails: the kernel's name still helps
        return os.uname().nodename


def check_java(env: Mapping[str, str], host: str | None = None) -> None:
    """Raise :class:`SparkInstallError` (``java_missing``) in one line naming the host when ``env`` has no Java."""
    missing = java_missing(env)
    if missing is not None:
        raise SparkInstallError(
            f"host {host or this_host()}: no Java for spark-submit ({missing}): install Java 17 on this host (it runs "
            "the Spark driver) or set JAVA_HOME in its environment", reason="java_missing")
