"""What spark-submit needs on the host that runs it: a Celery worker host runs the Spark driver (client mode), so it
needs Java and a Python that can run the job. These are the operator's checks (they import Airflow, so they are not
in spark/, which executors receive as a zip without Airflow); the executors' hosts are named in the job's failure
instead (airflow_jetstream/spark/failure.py), since only the job reaches them.

Without them, ``spark-class`` prints "JAVA_HOME is not set", or the JVM "Cannot run program "python3.9"", and the task
fails with the Spark provider's "Cannot execute: spark-submit ..." and the whole command line: nothing says which
host lacks what. The operator checks first and fails in one line naming the host (Airflow's ``[core]
hostname_callable``, the name the UI shows for the task) and the fix.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping

from airflow_jetstream.client.errors import SparkInstallError

#: The oldest Python the package runs on (pyproject.toml's requires-python): the driver runs it.
OLDEST_PYTHON = (3, 11)

#: Where spark-submit's PythonRunner takes the driver's Python from, first match wins (conf, then environment).
DRIVER_PYTHON_CONF = ("spark.pyspark.driver.python", "spark.pyspark.python")
DRIVER_PYTHON_ENV = ("PYSPARK_DRIVER_PYTHON", "PYSPARK_PYTHON")

#: What the driver's Python prints: its version, then whether it imports the package (when it must).
_PROBE = ("import importlib.util, sys\nprint('%d.%d' % sys.version_info[:2])\n"
          "print(all(importlib.util.find_spec(name) for name in sys.argv[1:]))")


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


def driver_python(conf: Mapping[str, str], env: Mapping[str, str]) -> tuple[str, str]:
    """``(python, where it was named)``: the Python spark-submit runs the driver with, as its PythonRunner picks it."""
    for key in DRIVER_PYTHON_CONF:
        if conf.get(key):
            return conf[key], key
    for name in DRIVER_PYTHON_ENV:
        if env.get(name):
            return env[name], name
    return "python3", "Spark's default"


def conf_in_properties(text: str) -> dict[str, str]:
    """The ``spark.*`` entries of a properties file's text (``key=value`` or ``key value``, as spark-defaults.conf)."""
    found = {}
    for line in text.splitlines():
        match = re.match(r"\s*(spark\.[^\s=:]+)\s*[=:\s]\s*(.*?)\s*$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def check_driver_python(conf: Mapping[str, str], env: Mapping[str, str], *, needs_package: bool,
                        host: str | None = None) -> str:
    """Run the driver's Python once (``python -c``) and raise :class:`SparkInstallError` in one line naming the host
    when it does not run here (``python_missing``), is older than the package supports (``python_mismatch``) or
    cannot import ``airflow_jetstream`` when the job is not shipped it (``package_missing``; pyspark is not checked:
    spark-submit puts its own on the driver's path). Returns its version."""
    python, named_by = driver_python(conf, env)
    where = f"host {host or this_host()}: the Spark driver's Python {python!r} ({named_by})"
    modules = ["airflow_jetstream"] if needs_package else []
    try:
        done = subprocess.run([python, "-c", _PROBE, *modules], env=dict(env), capture_output=True, text=True,
                              timeout=60, check=False)
    except OSError as exc:
        raise SparkInstallError(f"{where} does not run ({exc.strerror}): install it on this host or name one that "
                                "is installed", reason="python_missing") from None
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2:
        raise SparkInstallError(f"{where} does not run (exit code {done.returncode}): install it on this host or "
                                "name one that is installed", reason="python_missing")
    version, imports = lines
    if tuple(int(part) for part in version.split(".")) < OLDEST_PYTHON:
        raise SparkInstallError(
            f"{where} is Python {version}; the package needs {'.'.join(map(str, OLDEST_PYTHON))} or newer: name a "
            "newer one", reason="python_mismatch")
    if imports != "True":
        raise SparkInstallError(
            f"{where} (Python {version}) has no airflow_jetstream: install airflow-jetstream[spark] into it, name "
            "the Python that has it, or pass ship_package=True", reason="package_missing")
    return version
