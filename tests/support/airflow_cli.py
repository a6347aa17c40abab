"""The airflow CLI in a subprocess against an isolated Airflow home (sqlite), as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

AIRFLOW = str(Path(sys.executable).with_name("airflow"))


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
    migrate = run_airflow(["db", "migrate"], env)
    assert migrate.returncode == 0, migrate.stderr[-2000:]
    return env
