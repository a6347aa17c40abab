"""A Spark standalone cluster on loopback from the pyspark package's own Spark distribution.

A master and ``workers`` workers, each its own JVM (``spark-class ...deploy.master.Master`` /
``...deploy.worker.Worker``); every executor is a further JVM with its own Python workers. For tests
and ``make demo-cluster``; production points the ``spark`` connection at a real cluster::

    with EmbeddedSparkCluster(workers=2) as cluster:
        print(cluster.master_url)  # spark://127.0.0.1:<free port>, submit in client deploy mode
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from airflow_jetstream.embedded.server import EmbeddedServerError, free_port

#: How a Spark daemon logs the port a service bound: the one asked for, or a later one when that was taken (Spark
#: tries the next port, up to spark.port.maxRetries times, and says so only in its log).
_BOUND = re.compile(r"Successfully started service '(\w+)' on port (\d+)")


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package (``bin/spark-class``, jars)."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").is_file():
        raise EmbeddedServerError(f"pyspark at {home} has no bin/spark-class: install the full pyspark package")
    return home


class EmbeddedSparkCluster:
    """A Spark standalone master and workers bound to 127.0.0.1, each in its own process group.

    :param workers: number of workers (each runs the executors of an application).
    :param cores: cores per worker (one executor per worker with the default executor settings).
    :param memory: memory per worker (Spark notation, e.g. ``"1g"``).
    :param base_dir: where logs, worker dirs (executor stdout/stderr) and state go; a temp dir if None.
    """

    def __init__(self, *, workers: int = 2, cores: int = 1, memory: str = "1g",
                 base_dir: str | os.PathLike[str] | None = None, startup_timeout: float = 120.0) -> None:
        self.home = spark_home()
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="spark-embedded-"))
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.web_port = free_port()
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def worker_dir(self, index: int) -> Path:
        """Worker ``index``'s work dir: ``<app id>/<executor id>/stderr`` holds each executor's log."""
        return self.base_dir / f"worker-{index}"

    def executor_logs(self) -> list[Path]:
        """Every executor stdout/stderr file the workers wrote so far."""
        return sorted(p for i in range(self.workers) for p in self.worker_dir(i).glob("app-*/*/std*"))

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SPARK_HOME=str(self.home), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(self.base_dir),
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                   SPARK_NO_DAEMONIZE="1")
        return env

    def _launch(self, name: str, args: list[str]) -> None:
        with open(self.base_dir / f"{name}.log", "ab") as log:
            self.processes.append(subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *args], stdout=log, stderr=subprocess.STDOUT,
                env=self._env(), cwd=self.base_dir, start_new_session=True,
            ))

    def start(self) -> EmbeddedSparkCluster:
        if self.processes:
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        master_log = self.base_dir / "master.log"
        offset = master_log.stat().st_size if master_log.exists() else 0
        self._launch("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                "--port", str(self.port), "--webui-port", str(self.web_port)])
        try:
            self.port, self.web_port = self._bound_ports(master_log, offset, "sparkMaster", "MasterUI")
            self._wait(lambda s: True, "the master's status page")
            for index in range(self.workers):
                self.worker_dir(index).mkdir(parents=True, exist_ok=True)
                self._launch(f"worker-{index}", [
                    "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--webui-port", str(free_port()),
                    "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(self.worker_dir(index)),
                    self.master_url,
                ])
            self._wait(lambda s: s.get("aliveworkers", 0) >= self.workers, f"{self.workers} alive worker(s)")
        except BaseException:
            self.close()
            raise
        return self

    def _check_alive(self) -> None:
        dead = [p for p in self.processes if p.poll() is not None]
        if dead:
            raise EmbeddedServerError(f"a Spark daemon exited with {dead[0].returncode}: {self.log_tail()}")

    def _bound_ports(self, log: Path, offset: int, *services: str) -> list[int]:
        """The ports ``services`` bound, read from the daemon's log past ``offset``: a port free when it was
        chosen can be taken before the JVM binds it (another process's server or outgoing connection)."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            with log.open("rb") as out:
                out.seek(offset)
                bound = dict(_BOUND.findall(out.read().decode(errors="replace")))
            if all(name in bound for name in services):
                return [int(bound[name]) for name in services]
            self._check_alive()
            time.sleep(0.2)  # a starting JVM: bounded by the deadline
        raise EmbeddedServerError(f"Spark standalone cluster: {', '.join(services)} not started after "
                                  f"{self.startup_timeout}s: {self.log_tail()}")

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, cores, running applications)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as resp:
            return json.loads(resp.read())

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if ready(self.status()):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass
            time.sleep(0.2)
        raise EmbeddedServerError(
            f"Spark standalone cluster: no {what} after {self.startup_timeout}s: {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        tails = []
        for log in sorted(self.base_dir.glob("*.log")):
            tails.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(tails) or "(no log)"

    def close(self) -> None:
        """Stop the workers, then the master (SIGTERM, SIGKILL after 15 s); remove a temp base dir."""
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        self.processes = []
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedSparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
