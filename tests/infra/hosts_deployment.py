"""Airflow on the CeleryExecutor across five hosts of one machine (``make up-hosts``, the multi-host tests).

What runs where (docs/deployment.md, "Celery across hosts"); every server binds its host's own address:

========  ===========  ====================================================================================
host      address      runs
========  ===========  ====================================================================================
``db``    10.77.1.11   PostgreSQL (the metadata database), Redis (Debian's ``redis-server``: the Celery broker)
``ctl``   10.77.1.12   api-server (UI, JetStream view, execution API), scheduler, dag-processor
``w1``    10.77.1.13   Celery worker, triggerer, NATS node ``n1``, Spark worker
``w2``    10.77.1.14   Celery worker, triggerer, NATS node ``n2``, Spark worker
``edge``  10.77.1.15   NATS node ``n3``, Spark master
========  ===========  ====================================================================================

NATS requires TLS (a CA made for the deployment) and a user with a password; the example streams are R3. The
Spark jobs run in client deploy mode: the driver inside the Celery task on a worker host, the master on ``edge``.
The worker hosts share one volume, ``<root>/shared`` (the object store of a real deployment), where the examples
write their output. Each host gets only the files it reads (:mod:`tests.infra.hosts`)::

    with HostsDeployment(root) as deployment:    # the calling thread is in the client namespace meanwhile
        print(deployment.airflow.url)            # http://10.77.1.12:8080
        deployment.hosts["w1"].kill()            # a worker host loses power
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from cryptography.fernet import Fernet

from airflow_jetstream.embedded.cluster import CLUSTER_NAME, ClusterNode, EmbeddedNatsCluster
from airflow_jetstream.embedded.server import EmbeddedServerError
from tests.infra.airflow_local import LocalAirflow, LocalAirflowError
from tests.infra.hosts import NETWORK, REPO, Host, HostError, Hosts, namespaces_unavailable
from tests.infra.postgres import EmbeddedPostgres, EmbeddedPostgresError, apt_install
from tests.infra.spark_cluster import spark_home
from tests.infra.supervise import StopRequest, serve
from tests.support.tls import make_tls_files

NATS_PORT, NATS_ROUTE_PORT, NATS_MONITOR_PORT = 4222, 6222, 8222
API_PORT, POSTGRES_PORT, REDIS_PORT = 8080, 5432, 6379
SPARK_PORT, SPARK_WEB_PORT, SPARK_WORKER_WEB_PORT = 7077, 8080, 8081
NATS_HOSTS = {"n1": "w1", "n2": "w2", "n3": "edge"}
WORKER_HOSTS = ("w1", "w2")
NATS_USER = "airflow"


class HostNatsNode(ClusterNode):
    """A NATS cluster node on a host: TLS and a password for clients, routes to its peers, on the host's address."""

    def __init__(self, name: str, host: Host, *, routes: list[str], password: str) -> None:
        tls = host.etc / "tls"
        config = {
            "server_name": name, "host": host.address, "http": f"{host.address}:{NATS_MONITOR_PORT}",
            "cluster": {"name": CLUSTER_NAME, "host": host.address, "port": NATS_ROUTE_PORT, "routes": routes},
            "authorization": {"users": [{"user": NATS_USER, "password": password}]},
            "tls": {"cert_file": str(tls / "server.pem"), "key_file": str(tls / "server-key.pem"), "timeout": 5},
        }
        super().__init__(name, port=NATS_PORT, store_dir=host.private / "nats", tls_url=True, startup_timeout=60,
                         config=config)
        self.host = host
        self.monitor_port = NATS_MONITOR_PORT

    @property
    def url(self) -> str:
        return f"tls://{self.host.address}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{self.host.address}:{self.monitor_port}"

    def _spawn(self) -> None:
        self.write_config()
        self.config_path.chmod(0o600)  # it holds the password
        self.process = self.host.spawn(f"nats-{self.name}", [self.binary, "-c", str(self.config_path)])


class HostsNatsCluster(EmbeddedNatsCluster):
    """:class:`EmbeddedNatsCluster`'s health checks, leader look-ups, kills and restarts over nodes on hosts."""

    def __init__(self, nodes: list[HostNatsNode]) -> None:
        self._own_dir = False
        self.base_dir = nodes[0].base_dir.parent
        self.startup_timeout = 90.0
        self.nodes: list[ClusterNode] = list(nodes)


class HostsSpark:
    """A Spark standalone master on one host and a worker on each of others, bound to their hosts' addresses."""

    def __init__(self, master: Host, workers: list[Host], *, timeout: float = 180) -> None:
        self.master = master
        self.workers = workers
        self.timeout = timeout
        self.processes: list[tuple[Host, str, subprocess.Popen[bytes]]] = []

    @property
    def master_url(self) -> str:
        return f"spark://{self.master.address}:{SPARK_PORT}"

    def _env(self, host: Host) -> dict[str, str]:
        return {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": host.address,
                "SPARK_LOG_DIR": str(host.private / "spark"), "SPARK_NO_DAEMONIZE": "1",
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}

    def _launch(self, host: Host, key: str, args: list[str]) -> None:
        (host.private / "spark").mkdir(exist_ok=True)
        command = [str(spark_home() / "bin" / "spark-class"), *args]
        self.processes.append((host, key, host.spawn(key, command, self._env(host))))

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self.master.address}:{SPARK_WEB_PORT}/json/", timeout=5) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
            return answer

    def start(self) -> HostsSpark:
        """Start the master, then every worker at once, and wait until the master counts them all."""
        self.start_master()
        for host in self.workers:
            self._launch_worker(host)
        self._wait(lambda status: all(self._alive(status, host) for host in self.workers), "alive workers")
        return self

    def start_master(self) -> None:
        a = self.master.address
        self._launch(self.master, "spark-master", ["org.apache.spark.deploy.master.Master", "--host", a,
                                                   "--port", str(SPARK_PORT), "--webui-port", str(SPARK_WEB_PORT)])
        self._wait(lambda status: True, "the master's status page")

    def start_worker(self, host: Host) -> None:
        """Start the worker of ``host`` and wait until the master counts it."""
        self._launch_worker(host)
        self._wait(lambda status: self._alive(status, host), f"an alive worker on {host.name}")

    def _launch_worker(self, host: Host) -> None:
        self._launch(host, "spark-worker", [
            "org.apache.spark.deploy.worker.Worker", "--host", host.address, "--webui-port",
            str(SPARK_WORKER_WEB_PORT), "--cores", "1", "--memory", "1g",
            "--work-dir", str(host.private / "spark" / "work"), self.master_url])

    @staticmethod
    def _alive(status: dict[str, Any], host: Host) -> bool:
        return any(w.get("host") == host.address and w.get("state") == "ALIVE" for w in status.get("workers", []))

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for host, key, process in self.processes:
                if process.poll() is not None and process.returncode != -signal.SIGKILL:  # a host killed on purpose
                    raise HostError(f"host {host.name}: {key} exited with {process.returncode}: {host.log_tail(key)}")
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                if ready(self.status()):
                    return
            time.sleep(0.5)  # starting JVMs: bounded by the deadline
        raise HostError(f"Spark: no {what} after {self.timeout:.0f} s: {self.master.log_tail('spark-master')}")

    def close(self) -> None:
        for _host, _key, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _host, _key, process in reversed(self.processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.processes.clear()


class HostRedis:
    """Debian's ``redis-server`` on a host (installed with apt-get where missing), with a password, no persistence."""

    def __init__(self, host: Host, password: str) -> None:
        self.host = host
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker URL (it holds the password: never print it)."""
        return f"redis://:{self.password}@{self.host.address}:{REDIS_PORT}"

    def start(self, timeout: float = 60) -> HostRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            failure = apt_install("redis-server")
            binary = shutil.which("redis-server")
            if binary is None:
                raise HostError(f"host {self.host.name}: no redis-server and it could not be installed: {failure}")
        folder = self.host.private / "redis"
        folder.mkdir(exist_ok=True)
        conf = folder / "redis.conf"
        conf.touch(mode=0o600)
        conf.write_text(f"bind {self.host.address}\nport {REDIS_PORT}\nrequirepass {self.password}\ndir {folder}\n"
                        'save ""\nappendonly no\ndaemonize no\nprotected-mode yes\n')
        self.process = self.host.spawn("redis", [binary, str(conf)])
        client = redis.Redis(host=self.host.address, port=REDIS_PORT, password=self.password, socket_timeout=2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise HostError(f"host {self.host.name}: redis-server exited: {self.host.log_tail('redis')}")
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    return self
            time.sleep(0.2)  # a starting server: bounded by the deadline
        raise HostError(f"host {self.host.name}: redis-server does not answer after {timeout:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


class HostsDeployment:
    """The deployment of the module docstring under ``root``: :meth:`start` makes the hosts and starts everything
    (the calling thread enters the client namespace until :meth:`close`), :meth:`close` stops everything and
    removes the namespaces."""

    def __init__(self, root: Path, *, dags_folder: Path = REPO / "dags_examples", password: str | None = None,
                 settings: dict[str, str] | None = None) -> None:
        self.root = Path(root).resolve()
        self.hosts = Hosts(self.root, shared=WORKER_HOSTS)
        self.dags_folder = dags_folder
        self.settings = dict(settings or {})
        self._password = password
        self.nats_password = secrets.token_urlsafe(18)
        self.pg: EmbeddedPostgres | None = None
        self.redis: HostRedis | None = None
        self.nats: HostsNatsCluster | None = None
        self.spark: HostsSpark | None = None
        self.airflows: dict[str, LocalAirflow] = {}  # host name -> its Airflow components
        self._client = contextlib.ExitStack()

    fernet_key = ""  # set at start: the connections in the database (ctl and the triggerers read them)
    jwt_secret = ""  # set at start: the api-server signs task tokens and log requests, the workers check them

    @property
    def airflow(self) -> LocalAirflow:
        """The control host's Airflow (api-server, scheduler, dag-processor): its ``url``, ``user``, ``password``."""
        return self.airflows["ctl"]

    @property
    def nats_servers(self) -> str:
        assert self.nats is not None
        return self.nats.servers

    @property
    def ca_file(self) -> Path:
        """The CA bundle the ``nats_default`` connection names (the same path on every host, each host's own copy)."""
        return self.hosts["ctl"].etc / "tls" / "ca.pem"

    def start(self) -> HostsDeployment:
        why_not = namespaces_unavailable()
        if why_not:
            raise HostError(f"cannot make hosts on this machine: {why_not}")
        self.hosts.create()
        self.fernet_key = kept_secret(self.root / "control" / "fernet.key", lambda: Fernet.generate_key().decode())
        self._client.enter_context(self.hosts.client())
        try:
            self._start_services()
        except BaseException:
            self.close()
            raise
        return self

    def _start_services(self) -> None:
        """Start the hosts' servers at once where nothing orders them, as real hosts boot: the database host, NATS
        and Spark side by side; Airflow needs only the database and the broker (NATS and Spark by address)."""
        db = self.hosts["db"]
        self.pg = EmbeddedPostgres(db.private / "postgres", port=POSTGRES_PORT, host=db.address, clients=NETWORK,
                                   command_prefix=tuple(db.command([])))  # its tools run on db
        self.redis = HostRedis(db, secrets.token_urlsafe(18))
        self._deploy_tls()
        nodes = []
        for name, host_name in NATS_HOSTS.items():
            routes = [f"nats-route://{self.hosts[other].address}:{NATS_ROUTE_PORT}"
                      for peer, other in NATS_HOSTS.items() if peer != name]
            nodes.append(HostNatsNode(name, self.hosts[host_name], routes=routes, password=self.nats_password))
        self.nats = HostsNatsCluster(nodes)
        self.spark = HostsSpark(self.hosts["edge"], [self.hosts[name] for name in WORKER_HOSTS])
        with ThreadPoolExecutor(max_workers=3) as pool:  # threads made here are in the client namespace too
            starts: list[Callable[[], object]] = [self.nats.start, self.spark.start, self._start_airflow]
            for future in [pool.submit(start) for start in starts]:
                future.result()

    def _start_airflow(self) -> None:
        """The database host's servers, then Airflow on the control host and the worker hosts."""
        assert self.pg is not None and self.redis is not None and self.spark is not None
        self.pg.start()
        self.redis.start()
        common = self._airflow_settings()
        for name in ("ctl", *WORKER_HOSTS):
            host = self.hosts[name]
            self.airflows[name] = LocalAirflow(
                host.private / "airflow", nats_url=self.nats_servers, dags_folder=self.dags_folder,
                port=API_PORT, host=host.address, password=self._password, connections_in_db=True,
                nats_extra={"tls_ca_file": str(self.ca_file)}, nats_login=(NATS_USER, self.nats_password),
                database_url=self.pg.sqlalchemy_url, spark_master=self.spark.master_url,
                extra_env={**common, **host.variables()}, launch=host.command)
        # the api-server's signing secret, kept in its home (api-secrets.json, mode 600): the workers' log servers
        # check the requests it signs for task logs
        self.jwt_secret = self.airflow.env()["AIRFLOW__API_AUTH__JWT_SECRET"]
        for name in WORKER_HOSTS:
            self.airflows[name].extra_env["AIRFLOW__API_AUTH__JWT_SECRET"] = self.jwt_secret
        self.airflow.start(("api-server", "scheduler", "dag-processor"))
        for name in WORKER_HOSTS:
            self.start_worker_host(name)

    def start_worker_host(self, name: str) -> None:
        """Start a worker host's Airflow components: its triggerer and its Celery worker."""
        airflow = self.airflows[name]
        airflow.home.mkdir(parents=True, exist_ok=True)
        airflow.start_component("triggerer", f"triggerer-{name}")
        airflow.start_component("celery", f"celery-{name}", ("worker", "--concurrency", "2", "--celery-hostname",
                                                            f"{name}@hosts", "--without-mingle", "--without-gossip",
                                                            "--skip-serve-logs"))
        # the worker's log server on the host's address: the one the worker starts binds every address (Airflow
        # 3.3's serve_logs, host="", with no setting)
        airflow.start_component("log-server", f"logs-{name}")

    def _deploy_tls(self) -> None:
        """A CA for the deployment; its certificate to every host that connects to NATS, the server certificate and
        key to the NATS hosts only (each host its own copy: none reads a file another host wrote)."""
        made = make_tls_files(self.root / "control" / "tls", ca_name="airflow-jetstream hosts CA",
                              addresses=tuple(self.hosts[h].address for h in NATS_HOSTS.values()))
        for host in self.hosts.hosts.values():
            tls = host.own_etc / "tls"
            if host.name in ("ctl", *WORKER_HOSTS, *NATS_HOSTS.values()):
                tls.mkdir(parents=True, exist_ok=True)
                shutil.copy(made.ca, tls / "ca.pem")
            if host.name in NATS_HOSTS.values():
                shutil.copy(made.server_cert, tls / "server.pem")
                shutil.copy(made.server_key, tls / "server-key.pem")
                (tls / "server-key.pem").chmod(0o600)

    def _airflow_settings(self) -> dict[str, str]:
        """The settings every Airflow component on every host shares (the host's own are added to each)."""
        assert self.redis is not None
        api = f"http://{self.hosts['ctl'].address}:{API_PORT}"
        return {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": f"{self.redis.url}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"{self.redis.url}/1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
            "AIRFLOW__API__BASE_URL": api,
            "AIRFLOW__CORE__FERNET_KEY": self.fernet_key,
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "tests.infra.hosts.host_address",
            "AIRFLOW__CORE__PARALLELISM": "8",
            "JETSTREAM_DEMO_REPLICAS": "3",
            "JETSTREAM_DEMO_OUTPUT": str(self.root / "shared" / "output"),
            **self.settings,
        }

    def restart_host(self, name: str) -> None:
        """Start again what runs on host ``name`` after it was killed (:meth:`Host.kill`): its NATS node (same store),
        Spark daemon and Airflow components."""
        assert self.nats is not None and self.spark is not None
        host = self.hosts[name]
        host.kill()  # whatever a half-finished kill left
        self.spark.processes = [entry for entry in self.spark.processes if entry[0] is not host]
        for node, node_host in NATS_HOSTS.items():
            if node_host == name:
                self.nats.restart(node)
        if host is self.spark.master:
            self.spark.start_master()
        if host in self.spark.workers:
            self.spark.start_worker(host)
        if name in WORKER_HOSTS:
            self.start_worker_host(name)

    def restart_exited(self) -> list[str]:
        """Start again each Airflow component that exited on its own (``make up-hosts``' supervision)."""
        return [key for airflow in self.airflows.values() for key in airflow.restart_exited()]

    def close(self, *, graceful: bool = True) -> list[str]:
        """Stop everything (Airflow first, the database last), kill what is left on each host and remove the
        namespaces; returns what could not be removed. Not ``graceful``: SIGKILL everything at once (a test's
        deployment, thrown away afterwards)."""
        if not graceful:
            self._client.close()
            return self.hosts.remove()
        def close_airflow(airflow: LocalAirflow) -> None:
            with contextlib.suppress(LocalAirflowError, OSError, subprocess.SubprocessError):
                airflow.close()

        with ThreadPoolExecutor(max_workers=len(self.airflows) or 1) as pool:  # the hosts stop at once, as real ones
            list(pool.map(close_airflow, self.airflows.values()))
        if self.spark is not None:
            self.spark.close()
        if self.nats is not None:
            self.nats.close()
        if self.redis is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self.redis.stop()
        if self.pg is not None:
            with contextlib.suppress(EmbeddedPostgresError):
                self.pg.stop()
        self._client.close()
        return self.hosts.remove()

    def __enter__(self) -> HostsDeployment:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def kept_secret(path: Path, make: Callable[[], str]) -> str:
    """The secret kept in ``path`` (mode 600) by an earlier start, else a new one from ``make``, kept there."""
    if path.exists():
        return path.read_text().strip()
    path.touch(mode=0o600)
    path.write_text(make())
    return path.read_text()


def main() -> int:
    """``make up-hosts``: the deployment of the module docstring with the example DAGs, until Ctrl-C.

    Its files are in ``.up-hosts/`` of the checkout (``UP_HOSTS_HOME`` names another folder, not under /tmp);
    the namespaces exist only while it runs. A component that exits is restarted (one line on stderr each time).
    """
    root = Path(os.environ.get("UP_HOSTS_HOME") or REPO / ".up-hosts")
    stop = StopRequest()
    deployment = HostsDeployment(root, password=os.environ.get("AIRFLOW_UP_PASSWORD"))
    print("starting the hosts (db, ctl, w1, w2, edge) in network namespaces ...", flush=True)
    try:
        deployment.start()
    except (HostError, LocalAirflowError, EmbeddedServerError, EmbeddedPostgresError) as exc:
        print(f"up-hosts FAILED: {exc}", file=sys.stderr)
        return 1
    def banner() -> str:
        airflow = deployment.airflow
        client = deployment.hosts.topology.client
        return (f"\n{describe(deployment)}\n\nAirflow UI: {airflow.url} (inside the hosts' network: e.g. "
                f"`ip netns exec {client} curl {airflow.url}/api/v2/monitor/health`)\n  login: {airflow.user} / "
                f"{airflow.password}\n  each host's files and logs: {deployment.root / 'private'}/<host>/\n"
                "Ctrl-C stops everything.")

    def close() -> None:
        for line in deployment.close():
            print(f"not removed: {line}", file=sys.stderr)

    if serve(stop, "up-hosts", start=banner, restart_exited=deployment.restart_exited,
             stopping="stopping every host ...", close=close, errors=(LocalAirflowError,)):
        return 1
    print("stopped; no namespace left", flush=True)
    return 0


def describe(deployment: HostsDeployment) -> str:
    """One line per host: its name, address and what runs there."""
    runs = {
        "db": "PostgreSQL, Redis (Celery broker)",
        "ctl": "api-server, scheduler, dag-processor",
        "w1": "Celery worker, triggerer, NATS n1, Spark worker",
        "w2": "Celery worker, triggerer, NATS n2, Spark worker",
        "edge": "NATS n3, Spark master",
    }
    return "\n".join(f"  {name:<5} {host.address:<12} {runs[name]}" for name, host in deployment.hosts.hosts.items())


if __name__ == "__main__":
    sys.exit(main())
