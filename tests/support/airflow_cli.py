"""The airflow CLI in a subprocess against an isolated Airflow home (sqlite), as a user runs it."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
#: This process's first migrated sqlite database, copied into every later DAG-test home (see migrated_database).
_MIGRATED: list[Path] = []


def nats_conn_json(url: str, **fields) -> str:
    """An ``AIRFLOW_CONN_*`` value (JSON) for a nats connection to ``url``."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return json.dumps({"conn_type": "nats", "host": host, "port": int(port), **fields})


def isolated_airflow_env(home: Path, *, dags_folder: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment minus every Airflow setting, plus a fresh home and sqlite db."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__"))}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags_folder or home / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        **extra,
    )
    return env


def run_airflow(args: list[str], env: dict[str, str], *, timeout: int = 300,
                cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AIRFLOW, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False)


def dag_test_env(home: Path, nats_url: str, dag_files: dict[str, str], **extra: str) -> dict[str, str]:
    """Write ``dag_files`` (name -> source) into a new DAGs folder, point nats_default at ``nats_url``
    and migrate the database: ready for ``run_airflow(["dags", "test", dag_id], env)``."""
    dags = home / "dags"
    dags.mkdir(parents=True)
    for name, source in dag_files.items():
        (dags / name).write_text(textwrap.dedent(source))
    env = isolated_airflow_env(home, AIRFLOW_CONN_NATS_DEFAULT=nats_conn_json(nats_url), **extra)
    migrated_database(env)
    return env


def migrated_database(env: dict[str, str]) -> None:
    """Give the home of ``env`` (an :func:`isolated_airflow_env`) a migrated sqlite database. ``airflow db migrate``
    runs once per test process; later homes get a copy of that database, which holds the schema and Airflow's
    default rows and no path of the home that made it. It saves one migrate (5-15 s of the CLI) per DAG test."""
    target = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    if _MIGRATED:
        shutil.copyfile(_MIGRATED[0], target)
        return
    migrate = run_airflow(["db", "migrate"], env)
    assert migrate.returncode == 0, migrate.stderr[-2000:]
    keep = Path(tempfile.mkdtemp(prefix="airflow-migrated-"))
    atexit.register(shutil.rmtree, keep, ignore_errors=True)
    _MIGRATED.append(shutil.copyfile(target, keep / "airflow.db"))  # before the test writes to its own
