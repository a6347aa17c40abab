"""A Spark Connect server on loopback from the pyspark package's own Spark distribution.

pyspark's wheel ships the server's jar (``jars/spark-connect_*.jar``) but not
``sbin/start-connect-server.sh``; that script only runs ``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``, which this does directly, in its own
process group. For tests and local trials; production points a ``spark_connect`` connection at a
real server::

    with EmbeddedSparkConnectServer(conf={"spark.eventLog.enabled": "true"}) as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from airflow_jetstream.embedded.server import EmbeddedServerError, free_port
from tests.infra.spark_cluster import spark_home

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
READY_LINE = "Spark Connect server started at"
#: The server's log when its port was taken meanwhile (Spark Connect does not move to the next port).
PORT_TAKEN = "Failed to bind to address"


def stop_process_group(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM to the process group a ``start_new_session`` child leads, SIGKILL after ``timeout`` seconds."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


class EmbeddedSparkConnectServer:
    """``spark-submit`` running the Spark Connect server, bound to 127.0.0.1, with ``master`` as its master.

    :param conf: more Spark conf for the server (``--conf key=value``).
    :param env: environment for the server (e.g. ``PYSPARK_PYTHON``: the Python its workers run).
    :param base_dir: where ``server.log`` goes; a temp dir if None.
    """

    def __init__(self, *, master: str = "local[2]", conf: Mapping[str, str] | None = None,
                 env: Mapping[str, str] | None = None, base_dir: str | os.PathLike[str] | None = None,
                 startup_timeout: float = 180.0) -> None:
        self.home = spark_home()
        self.master = master
        self.conf = dict(conf or {})
        self.env = dict(env or {})
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="spark-connect-"))
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "server.log"

    def start(self) -> EmbeddedSparkConnectServer:
        """Start the server; a port taken between its choice and the server's bind is chosen again (3 tries)."""
        if self.process is not None:
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            offset = len(self.log())
            self._spawn()
            problem = self._wait_ready(offset)
            if problem is None:
                return self
            self.close()
            if PORT_TAKEN not in self.log()[offset:]:
                break
            self.port = free_port()
        raise EmbeddedServerError(problem)

    def _spawn(self) -> None:
        conf = {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(self.port),
                "spark.ui.enabled": "false", **self.conf}
        args = [str(self.home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", self.master,
                "--name", "Spark Connect server"]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        env = {**os.environ, "SPARK_HOME": str(self.home), "SPARK_LOCAL_IP": "127.0.0.1", **self.env}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.base_dir,
                                            start_new_session=True)

    def _wait_ready(self, offset: int) -> str | None:
        """None once the server says it started (in its log past ``offset``), else what went wrong."""
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while READY_LINE not in self.log()[offset:]:
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.log()[offset:].splitlines()[-15:])
                how = f"exited with {self.process.returncode}" if self.process.poll() is not None \
                    else f"did not start within {self.startup_timeout}s"
                return f"Spark Connect server on port {self.port} {how}:\n{tail}"
            time.sleep(0.2)  # a starting JVM: bounded by the deadline
        return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def close(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 15 s."""
        process, self.process = self.process, None
        if process is not None:
            stop_process_group(process)

    def __enter__(self) -> EmbeddedSparkConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
